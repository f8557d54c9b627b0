"""Issue 49 item 7 and item 18's row for run/steps/unclaimed.py: writes are attributed by who could have
made them. Two shared attempts of one fleet (one UnclaimedWrites step, as a fleet has), each writing only
its own claimed file, name nothing whichever ends last; an intruder's write into a file another task claims
is named when the claimant could not have made it (its claim was taken after the write); directory claims,
deletions, an already-changed file rewritten and `released` with or without `ended` are pinned."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptState, RunSettings
from stellafleet.run.steps.unclaimed import UnclaimedWrites
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")


@contextmanager
def _fleet(repo: Path, files: tuple[str, ...]) -> Iterator[tuple[UnclaimedWrites, ClaimStore, Path]]:
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("original\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "files", cwd=repo)
    ctx = make_attempt(repo, "setup")
    settings = RunSettings(
        repo, ctx.run_id, "0" * 40, "command", config=Config({"fleet": {"strict_claims": True}})
    )
    with Ledger.open(ctx.paths.fleet_db) as ledger, ClaimStore.open(ctx.paths.store_db) as store:
        yield UnclaimedWrites(settings, ledger, store), store, repo


def _start(step: UnclaimedWrites, store: ClaimStore, repo: Path, task_id: str, *claims: str) -> AttemptState:
    """A shared attempt started: its claims taken in the store (held by this live process), the step told."""
    ctx = make_attempt(repo, task_id)
    if claims:
        store.acquire(list(claims), Holder.current(ctx.run_id, task_id, "", ctx.attempt_id, pid=os.getpid()))
    attempt = AttemptState(PlanTask(task_id, "p", "t", claims=claims), threading.Event(), context=ctx)
    step.before_start(attempt)
    return attempt


def _end(step: UnclaimedWrites, store: ClaimStore, attempt: AttemptState) -> AttemptEnd:
    """Its end as the step sees it, then its claims released (as the claims step does)."""
    end = step.ended(attempt, DONE)
    step.released(attempt)
    store.release_attempt(attempt.ctx.run_id, attempt.ctx.attempt_id)
    return end


def test_two_tasks_each_writing_its_own_claimed_file_name_nothing_whichever_ends_last(git_repo: Path) -> None:
    with _fleet(git_repo, ("a.txt", "b.txt")) as (step, store, repo):
        a = _start(step, store, repo, "a", "a.txt")
        b = _start(step, store, repo, "b", "b.txt")
        (repo / "a.txt").write_text("a's work\n")
        (repo / "b.txt").write_text("b's work\n")
        assert _end(step, store, a) == DONE  # b.txt: b is running and claims it
        assert _end(step, store, b) == DONE  # a.txt: a made it while it ran, though its claim is gone now


def test_an_intruders_write_into_a_file_claimed_after_it_is_named(git_repo: Path) -> None:
    with _fleet(git_repo, ("b.txt", "x.txt")) as (step, store, repo):
        intruder = _start(step, store, repo, "x", "x.txt")
        (repo / "b.txt").write_text("the intruder's\n")
        written = time.time_ns() - 1_000_000_000  # a second before the claimant's claim: no sleep needed
        os.utime(repo / "b.txt", ns=(written, written))
        claimant = _start(step, store, repo, "b", "b.txt")  # running, its claim live, when x ends
        end = _end(step, store, intruder)
        assert end.outcome == AttemptOutcome.FAILED
        assert end.reason == "changed files it did not claim: b.txt ([fleet] strict_claims)"
        assert _end(step, store, claimant) == DONE  # b.txt changed before it started: not its


def test_directory_claims_deletions_and_an_already_changed_file_rewritten(git_repo: Path) -> None:
    with _fleet(git_repo, ("src/app.py", "gone.txt", "old.txt")) as (step, store, repo):
        (repo / "old.txt").write_text("changed before the attempt\n")
        attempt = _start(step, store, repo, "t", "src/")
        (repo / "src" / "app.py").write_text("inside its claimed folder\n")
        (repo / "src" / "new.py").write_text("a new file in it\n")
        (repo / "gone.txt").unlink()
        (repo / "old.txt").write_text("rewritten by the attempt, longer than before\n")
        end = _end(step, store, attempt)
        assert end.reason == "changed files it did not claim: gone.txt, old.txt ([fleet] strict_claims)"


def test_an_attempt_released_without_ending_no_longer_covers_later_writes(git_repo: Path) -> None:
    with _fleet(git_repo, ("a.txt", "y.txt")) as (step, store, repo):
        never = _start(step, store, repo, "a", "a.txt")
        step.released(never)  # its worker never started: no ended()
        store.release_attempt(never.ctx.run_id, never.ctx.attempt_id)
        step.released(never)  # released twice is harmless
        later = _start(step, store, repo, "y", "y.txt")
        (repo / "a.txt").write_text("later's\n")
        written = time.time_ns() + 1_000_000_000  # well after the first attempt was released
        os.utime(repo / "a.txt", ns=(written, written))
        assert (
            _end(step, store, later).reason == "changed files it did not claim: a.txt ([fleet] strict_claims)"
        )
