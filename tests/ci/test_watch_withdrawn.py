"""A branch whose CI passes after its remote branch was deleted, or its PR closed, while `--watch` followed
it ends not green, with that reason: a CI gate or a later `stella merge` must not land withdrawn work.
The remote branch is deleted for real from the bare origin; the PR is closed in the in-process FakeGh,
since the local GitHub API server cannot close one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.watchrepo import RUN_ID, Repo, git, make_repo

from stellafleet.ci.gh import GhResult
from stellafleet.ci.watch import watch_run
from stellafleet.core.config import Config
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.fake_gh import FakeGh

PASSED = [{"databaseId": 501, "name": "build", "workflowName": "CI", "status": "completed",
           "conclusion": "success", "updatedAt": "2026-11-30T12:05:00Z"}]  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repo]:
    yield make_repo(tmp_path, monkeypatch)


class Withdrawing(FakeGh):
    """gh whose first `run list` comes after the reviewer withdrew the branch (withdraw() does it)."""

    def __init__(self, script: dict[str, Any], withdraw: Any) -> None:
        super().__init__(script)
        self.withdraw = withdraw

    def run(self, args: Sequence[str], *, cwd: Path) -> GhResult:
        if list(args[:2]) == ["run", "list"] and self.withdraw is not None:
            self.withdraw(self)
            self.withdraw = None
        return super().run(args, cwd=cwd)


def _watch(repo: Repo, withdraw: Any) -> Any:
    repo.add_run()
    gh = Withdrawing({"runs": {repo.shas["t1"]: [PASSED]}}, withdraw)
    return watch_run(repo.root, RUN_ID, config=Config({}), clock=FakeClock(), gh=gh, out=None)


def test_a_branch_deleted_from_the_remote_while_ci_ran_ends_not_green(repo: Repo) -> None:
    branch = f"fleet/t1-{RUN_ID[-4:]}"
    result = _watch(repo, lambda gh: git("branch", "-D", branch, cwd=repo.origin))
    [watched] = result.branches
    assert watched.state != "green" and result.exit_code == 4
    assert watched.reason == f"branch {branch} was deleted from origin while its CI ran: not green"
    assert repo.ci_rows()[0]["state"] != "green"


def test_a_pr_closed_while_ci_ran_ends_not_green(repo: Repo) -> None:
    def close(gh: FakeGh) -> None:
        state = gh.state()
        for pr in state["prs"]:
            pr["state"] = "CLOSED"
        gh._save(state)

    result = _watch(repo, close)
    [watched] = result.branches
    assert watched.state != "green" and result.exit_code == 4
    assert watched.reason == "PR #1 was closed while its CI ran: not green"
