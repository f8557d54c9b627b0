"""Every gh call stellafleet makes, run with the real gh against the local GitHub API server, and what
the watch does when GitHub rate-limits it or fails: waited out and retried at the user guide's pace
(every 30 s, for at most the 20 minutes a branch may go without progress), then reported by name.

The server and the watch share one FakeClock, so CI's minutes and the retries' waits take no real time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.realgh import REPO, GitHubHost
from helpers.watchrepo import RUN_ID, Repo, git, make_repo

from stellafleet.ci.gh import GhError, GitHub, Retry, SystemGh
from stellafleet.ci.watch import BranchWatch, WatchResult, watch_run
from stellafleet.core.config import Config
from stellafleet.git import gitops
from stellafleet.testing.clock import FakeClock

CI_SECONDS = 90.0  # queued 0-30 s, in progress 30-90 s, then done


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def host(github_host: Callable[..., GitHubHost], clock: FakeClock) -> GitHubHost:
    return github_host(ci_seconds=CI_SECONDS, clock=clock)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: GitHubHost) -> Repo:
    return make_repo(
        tmp_path, monkeypatch, origin=host.local_server.state.repos[REPO].path, url=host.clone_url()
    )


class Notes:
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.result: WatchResult | None = None

    def note(self, message: str) -> None:
        self.notes.append(message)

    def changed(self, watch: BranchWatch) -> None:
        pass

    def finished(self, result: WatchResult) -> None:
        self.result = result


def watch(repo: Repo, host: GitHubHost, clock: FakeClock, **settings: float) -> tuple[WatchResult, Notes]:
    notes = Notes()
    config = Config({"watch": {"repo": host.repo_flag, **settings}})
    return watch_run(repo.root, RUN_ID, config=config, clock=clock, out=notes), notes


def test_each_gh_call_of_the_watch_against_the_real_gh(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    github = GitHub(SystemGh(), repo.root, repo=host.repo_flag, retry=Retry(clock=clock))
    github.check_auth()  # gh auth status
    git("switch", "-q", "-c", "fleet/red", cwd=repo.root)
    (repo.root / ".ci-result").write_text("failure\n")
    git("add", ".ci-result", cwd=repo.root)
    git("commit", "-qm", "red work", cwd=repo.root)
    sha = git("rev-parse", "HEAD", cwd=repo.root)
    gitops.push(repo.root, "origin", "fleet/red")

    assert github.find_open_pr("fleet/red") is None  # gh pr list --head ... --json number,url,body
    created = github.create_pr("fleet/red", "main", "Red work", "the body")  # gh pr create
    assert (created.number, created.url) == (1, f"https://{host.host}/octo/widgets/pull/1")
    assert github.find_open_pr("fleet/red") == created
    assert github.view_pr("fleet/red") == created  # gh pr view BRANCH --json number,url,body
    github.edit_pr_body(1, "the new body")  # gh pr edit 1 --body ...
    assert host.prs()[0]["body"] == "the new body"
    with pytest.raises(
        GhError, match=r'a pull request for branch "fleet/red" into branch "main" already exists'
    ):
        github.create_pr("fleet/red", "main", "Red work", "again")

    [run] = github.list_runs(sha)  # gh run list --commit SHA --limit 100 --json ...
    assert (run.status, run.conclusion, run.workflow, run.attempt) == ("queued", "", "CI", 1)
    assert run.url == f"https://{host.host}/octo/widgets/actions/runs/{run.id}"
    clock.advance(CI_SECONDS / 2)
    assert github.list_runs(sha)[0].status == "in_progress"
    clock.advance(CI_SECONDS)
    [done] = github.list_runs(sha)
    assert (done.status, done.conclusion) == ("completed", "failure")
    assert done.updated_at != run.updated_at
    log = github.failed_log(run.id)  # gh run view ID --log-failed
    assert "build\tRun tests\t" in log and f".ci-result says failure at {sha[:12]}" in log
    assert "Set up job" not in log  # only the failed step's lines
    with pytest.raises(GhError, match="gh run view 123 --log-failed failed"):
        github.failed_log(123)


def test_rate_limits_and_server_errors_are_waited_out_and_retried(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run()
    host.fault(429, "PullRequestCreate", times=2, retry_after=60)
    host.fault(502, "PullRequestUpdate", times=1)
    host.fault(403, "GET /api/v3/repos/octo/widgets/actions/runs", times=3, retry_after=60)
    result, notes = watch(repo, host, clock)
    assert result.exit_code == 0, [b.reason for b in result.branches]
    [branch] = result.branches
    assert branch.state == "green" and branch.pr_number == 1
    assert notes.notes.count("gh pr create: GitHub rate limit (HTTP 429); retrying in 30s") == 2
    assert "gh pr edit: GitHub server error (HTTP 502); retrying in 30s" in notes.notes
    polled = [n for n in notes.notes if "gh run list failed: GitHub rate limit (HTTP 403)" in n]
    assert len(polled) == 1 and polled[0].endswith("(will retry)")  # said once while it lasts
    [pr] = host.prs()
    assert "**green**: all 1 CI runs passed" in pr["body"]
    assert host.operations().count("mutation PullRequestCreate") == 3


def test_github_failing_for_longer_than_the_stall_timeout_is_reported_by_name(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run(isolated=("t1", "t2"))
    host.fault(503, "PullRequestCreate", times=10_000)
    # the guide's 30 s between tries; a 2-minute stall timeout instead of 20 keeps the test short (every
    # try is a real gh call)
    result, _ = watch(repo, host, clock, stall_timeout=120)
    assert result.exit_code == 4
    first, second = result.branches
    assert first.state == "error" and second.state == "error"
    assert first.reason is not None and first.reason.startswith(f"gh pr create failed for {first.branch}: ")
    assert "GitHub server error (HTTP 503) (still failing after 2m00s of retries)" in first.reason
    assert "HTTP 503: Server Error" in first.reason  # gh's own words follow the name
    assert clock.now() >= 2 * 120  # each branch's pull request was retried for the stall timeout
    assert host.operations().count("mutation PullRequestCreate") == 2 * 5  # every 30 s from 0 s to 120 s


def test_a_rate_limited_run_list_ends_no_ci_naming_the_rate_limit(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run()
    host.fault(429, "GET /api/v3/repos/octo/widgets/actions/runs", times=10_000, retry_after=60)
    result, _ = watch(repo, host, clock, appear_timeout=120)
    [branch] = result.branches
    assert branch.state == "no_ci" and branch.reason is not None
    assert "(gh kept failing: gh run list failed: GitHub rate limit (HTTP 429): " in branch.reason
    assert "API rate limit exceeded" in branch.reason


def test_a_remote_whose_host_has_a_port_needs_no_watch_repo_setting(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    """gh cannot match `localhost:PORT` in a remote URL to GH_HOST; stella tells it --repo HOST:PORT/O/N."""
    repo.add_run()
    notes = Notes()
    result = watch_run(repo.root, RUN_ID, config=Config({}), clock=clock, out=notes)
    [branch] = result.branches
    assert branch.pr_number == 1, branch.reason
    assert result.exit_code == 0 and branch.state == "green"
