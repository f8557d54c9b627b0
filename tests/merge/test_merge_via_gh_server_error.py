"""Issue 49 item 17: `gh auth status` says "the token is invalid" for a GitHub 502 as for a bad login. With
the real gh against the local GitHub API server answering real 502s, `stella merge --via-gh` retries a
transient one and goes on, names a lasting one as the server's error (not `gh is not authenticated`), and
still says a login that does not work is one."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import write_config
from helpers.merging import build_run
from helpers.realgh import GitHubHost
from helpers.repo import StellaRunner

from stellafleet.ci.gh import GitHub, Retry, SystemGh
from stellafleet.testing.clock import FakeClock

LOGIN_CALLS = ("UserCurrent", "GET /api/v3/")  # what gh auth status asks; gh api / asks the second


def _configured(root: Path, host: GitHubHost) -> None:
    build_run(root, prs=True)
    write_config(
        root, extra=f'[watch]\nrepo = "{host.repo_flag}"\npoll_interval = 0.05\nstall_timeout = 0.3\n'
    )


def test_a_transient_502_at_the_login_check_is_retried_and_passes(git_repo: Path, host: GitHubHost) -> None:
    for call in LOGIN_CALLS:
        host.fault(502, call, times=1)
    clock = FakeClock()
    GitHub(SystemGh(), git_repo, repo=host.repo_flag, retry=Retry(1.0, 60.0, clock)).check_auth()
    assert not host.local_server.state.faults  # both 502s were answered, and the login still counted


def test_a_lasting_502_is_named_as_the_servers_error_not_as_a_login(
    git_repo: Path, host: GitHubHost, stella_main: StellaRunner
) -> None:
    _configured(git_repo, host)
    for call in LOGIN_CALLS:
        host.fault(502, call, times=1000)
    proc = stella_main("merge", "--via-gh", "--unwatched", cwd=git_repo)
    assert proc.returncode == 2
    assert "not authenticated" not in proc.stderr
    assert "GitHub server error (HTTP 502) (still failing after" in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("try again once GitHub answers")


def test_a_bad_login_is_still_said_to_be_one(
    git_repo: Path, host: GitHubHost, stella_main: StellaRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    _configured(git_repo, host)
    monkeypatch.setenv("GH_ENTERPRISE_TOKEN", "not-the-token")
    proc = stella_main("merge", "--via-gh", "--unwatched", cwd=git_repo)
    assert proc.returncode == 2
    assert "gh is not authenticated" in proc.stderr and "gh auth login" in proc.stderr
