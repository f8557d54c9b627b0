"""`stella merge --via-gh` in process, on a hand-built ledger, against the in-process FakeGh: closed pull
requests and GitHub's 5xx answers, which the local GitHub API server cannot be made to give (it can
neither close a pull request nor fail `gh auth status`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.repo import git

from stellafleet.core.configsections import WatchConfig
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.merge.runner import MergeOptions
from stellafleet.merge.viagh import merge_via_gh
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.fake_gh import FakeGh
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN = "r-20261201-100000-dddd"


def _green_run(repo: Path) -> None:
    """base and top (which depends on base) succeeded, their branches green with PRs #1 and #2."""
    tasks = [
        sample_task("base", isolation="isolated"),
        sample_task("top", depends_on=("base",), isolation="isolated"),
    ]
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        add_run(ledger, RUN, root=str(repo))
        ledger.tasks.add(RUN, tasks, {"base": 1, "top": 2})
        for number, task in enumerate(("base", "top"), start=1):
            branch = f"fleet/{task}"
            git("branch", branch, cwd=repo)
            ledger.tasks.set_workspace(RUN, task, branch, None)
            attempt = ledger.attempts.start(RUN, task, pipeline="command", branch=branch)
            ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="done"))
            ledger.tasks.set_status(RUN, task, "succeeded")
            ledger.ci.upsert(
                run_id=RUN, branch=branch, task_id=task, head_sha=None, pr_url=None, pr_number=number,
                state="green", conclusion="success", reason="all 1 CI runs passed", run_urls=[],
            )  # fmt: skip
        ledger.runs.finish(RUN, "succeeded", exit_code=0)


def _merge(repo: Path, script: dict[str, Any], *, dry_run: bool) -> dict[str, tuple[str, str]]:
    settings = WatchConfig(poll_interval=1, stall_timeout=5)
    result = merge_via_gh(
        repo, MergeOptions(dry_run=dry_run, strategy="squash"), settings, gh=FakeGh(script), clock=FakeClock()
    )
    return {item.task_id: (str(item.status), item.reason) for item in result.queue}


def _prs(base_state: str) -> list[dict[str, Any]]:
    return [
        {"number": 1, "headRefName": "fleet/base", "state": base_state},
        {"number": 2, "headRefName": "fleet/top", "state": "OPEN"},
    ]


def test_a_dry_run_counts_what_would_land_as_landed_for_its_dependents(git_repo: Path) -> None:
    _green_run(git_repo)
    items = _merge(git_repo, {"prs": _prs("OPEN")}, dry_run=True)
    assert items["base"][1] == "would ask GitHub to merge PR #1 (squash)"
    assert items["top"][1] == "would ask GitHub to merge PR #2 (squash)"


def test_a_dry_run_says_a_closed_pr_would_not_land_and_skips_its_dependents(git_repo: Path) -> None:
    _green_run(git_repo)
    items = _merge(git_repo, {"prs": _prs("CLOSED")}, dry_run=True)
    assert items["base"][1] == "PR #1 is closed, not open: it would not land"
    assert items["top"][1] == "depends on base, which did not land"


def test_a_5xx_during_the_auth_preflight_is_retried_and_named(git_repo: Path) -> None:
    _green_run(git_repo)
    bad = {"exit": 1, "stderr": "HTTP 502: Bad Gateway (https://api.github.com/user)\n"}
    once = {"prs": _prs("OPEN"), "replies": {"auth status": [bad, {"stdout": "Logged in\n"}]}}
    _merge(git_repo, once, dry_run=False)  # the second `gh auth status` answered: no error
    with pytest.raises(StellaError) as raised:
        _merge(git_repo, {"prs": _prs("OPEN"), "replies": {"auth status": [bad]}}, dry_run=False)
    said = str(raised.value)
    assert "GitHub server error (HTTP 502)" in said and "not authenticated" not in said, said
