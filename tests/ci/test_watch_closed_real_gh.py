"""--watch with the real gh against the local GitHub API server, its pull request closed mid-way (while CI
runs) by `gh pr close`: the branch ends not green. Needs the watch's withdrawn-work check."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.realgh import REPO, GitHubHost
from helpers.watchrepo import RUN_ID, Repo, make_repo

from stellafleet.ci.watch import watch_run
from stellafleet.core.config import Config
from stellafleet.testing.clock import FakeClock


class ReviewerClosing(FakeClock):
    """The watch's clock; at its first wait (the PR open, CI queued) a reviewer closes the PR with gh."""

    def __init__(self, host: GitHubHost) -> None:
        super().__init__()
        self.host: GitHubHost | None = host

    def sleep(self, seconds: float) -> None:
        if self.host is not None and self.host.prs():
            host, self.host = self.host, None
            number = str(host.prs()[0]["number"])
            subprocess.run([host.gh, "pr", "close", number, "-R", host.repo_flag], check=True, env=os.environ)
        super().sleep(seconds)


def test_watch_of_a_pr_closed_while_its_ci_ran_ends_not_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, github_host: Callable[..., GitHubHost]
) -> None:
    clock = FakeClock()
    host = github_host(ci_seconds=90.0, clock=clock)
    repo: Repo = make_repo(
        tmp_path, monkeypatch, origin=host.local_server.state.repos[REPO].path, url=host.clone_url()
    )
    repo.add_run()
    closing = ReviewerClosing(host)
    host.local_server.state.clock = closing  # the server's CI and the watch share the one clock
    result = watch_run(repo.root, RUN_ID, config=Config({"watch": {"repo": host.repo_flag}}), clock=closing)
    [branch] = result.branches
    assert host.prs()[0]["state"] == "CLOSED"
    assert branch.state != "green" and result.exit_code == 4
    assert branch.reason == f"PR #{branch.pr_number} was closed while its CI ran: not green"
