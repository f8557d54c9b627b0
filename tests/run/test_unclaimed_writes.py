"""A shared attempt's writes outside claims (run/steps/unclaimed.py): named in its summary and the ledger,
and a failure under `[fleet] strict_claims`; its own claims, another running task's, and the files that were
already changed and stayed so are not its."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptState, RunSettings
from stellafleet.run.steps.unclaimed import UnclaimedWrites
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger


def _ended(repo: Path, *, strict: bool) -> tuple[AttemptEnd, list[str]]:
    for name in ("mine.txt", "theirs.txt", "stray.txt", "old.txt"):
        (repo / name).write_text("original\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "files", cwd=repo)
    (repo / "old.txt").write_text("changed before the attempt, left alone\n")
    ctx = make_attempt(repo)
    settings = RunSettings(
        repo, ctx.run_id, "0" * 40, "command", config=Config({"fleet": {"strict_claims": strict}})
    )
    with Ledger.open(ctx.paths.fleet_db) as ledger, ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(["theirs.txt"], Holder.current(ctx.run_id, "other", "", 99, pid=os.getpid()))
        step = UnclaimedWrites(settings, ledger, store)
        attempt = AttemptState(PlanTask("t1", "p", "t", claims=("mine.txt",)), threading.Event(), context=ctx)
        step.before_start(attempt)
        for name in ("mine.txt", "theirs.txt", "stray.txt", "new.txt"):
            (repo / name).write_text("the worker's\n")
        end = step.ended(attempt, AttemptEnd(AttemptOutcome.SUCCEEDED, "done"))
        row = next(a for a in ledger.get_run(ctx.run_id)["attempts"] if a["id"] == ctx.attempt_id)
    return end, row["unclaimed_writes"]


@pytest.mark.parametrize("strict", [False, True])
def test_files_no_running_task_claims_are_named_and_fail_the_attempt_when_strict(
    git_repo: Path, strict: bool
) -> None:
    end, recorded = _ended(git_repo, strict=strict)
    assert recorded == '["new.txt", "stray.txt"]'
    said = "changed files it did not claim: new.txt, stray.txt"
    if strict:
        assert end.outcome == AttemptOutcome.FAILED and end.reason == f"{said} ([fleet] strict_claims)"
    else:
        assert end.outcome == AttemptOutcome.SUCCEEDED and end.summary == f"done; {said}"
