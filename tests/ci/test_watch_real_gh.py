"""stella watch with the real gh against the local GitHub API server: the watch's own steps (CI states as
they come, the pull request opened once and kept current, the login check) and the `stella watch` CLI.

In-process tests share one FakeClock with the server, so its CI's minutes pass as the watch sleeps.
The watch's logic for cases the server cannot produce (cancelled, stalled, timed out runs, gh blips) is
tested with the in-process FakeGh in test_watch.py.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.realgh import REPO, GitHubHost
from helpers.repo import run_stella
from helpers.watchrepo import RUN_ID, Repo, make_repo

from stellafleet.ci.gh import STATUS_END, STATUS_START
from stellafleet.ci.watch import BranchWatch, ConsoleReporter, WatchResult, watch_run
from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.testing.clock import FakeClock

CI_SECONDS = 60.0  # queued for 20 s, in progress until 60 s


class Events:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)

    def changed(self, watch: BranchWatch) -> None:
        pass

    def finished(self, result: WatchResult) -> None:
        pass


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


def config(host: GitHubHost) -> Config:
    return Config({"watch": {"repo": host.repo_flag}})


def test_green_after_queued_then_in_progress_then_success(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run()
    sha = repo.shas["t1"]
    out = io.StringIO()
    result = watch_run(repo.root, RUN_ID, config=config(host), clock=clock, out=ConsoleReporter(out))

    assert result.exit_code == 0
    [branch] = result.branches
    assert (branch.state, branch.conclusion) == ("green", "success")
    assert clock.now() == 60.0  # polled at 0 s (queued), 30 s (in progress) and 60 s (done)
    assert repo.remote_sha(branch.branch) == sha
    ops = host.operations()
    assert ops.count("GET /api/v3/repos/octo/widgets/actions/runs") == 3
    assert ops.count("mutation PullRequestUpdate") == 3  # queued, in progress, green: once per change
    [pr] = host.prs()
    assert (pr["head"], pr["base"], pr["title"]) == (branch.branch, "main", "Title of t1")
    body = pr["body"]
    for expected in ("Title of t1", "Summary of t1: added the work file.", "$0.42", sha[:12], "t1: add work"):
        assert expected in body
    assert body.count(STATUS_START) == 1 and body.count(STATUS_END) == 1
    assert "**green**: all 1 CI runs passed" in body
    [row] = repo.ci_rows()
    url = f"https://{host.host}/octo/widgets/pull/{pr['number']}"
    assert (row["state"], row["conclusion"], row["pr_url"], row["pr_number"]) == ("green", "success", url, 1)
    assert row["head_sha"] == sha and row["task_id"] == "t1"
    [run] = host.state()["repos"][REPO]["runs"][1:]  # the first run is main's, pushed by the fixture
    assert row["run_urls"] == [f"https://{host.host}/octo/widgets/actions/runs/{run['id']}"]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        f"watch: {branch.branch} PR #1: pending: pushed {sha[:12]} to origin; opened PR #1"
    )
    assert any("0/1 runs complete (1 queued)" in line for line in lines)
    assert any("0/1 runs complete (1 in progress)" in line for line in lines)
    assert any(": green: all 1 CI runs passed" in line for line in lines)
    assert lines[-1].startswith(f"{branch.branch}  {url}  green  success")


def test_pr_is_created_once_and_a_second_watch_sees_the_rerun_pass(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run(ci_result="failure")
    first = watch_run(repo.root, RUN_ID, config=config(host), clock=clock, out=Events())
    assert first.exit_code == 4
    [before] = host.prs()
    assert "**red**: failure: CI" in before["body"]

    [run] = first.branches[0].runs
    host.local_server.state.rerun(
        host.local_server.state.repos[REPO], run.id, failing=False
    )  # "Re-run jobs" on GitHub
    second = watch_run(repo.root, RUN_ID, config=config(host), clock=clock, out=Events())
    assert second.exit_code == 0
    [after] = second.branches[0].runs
    assert (after.id, after.attempt, after.conclusion) == (run.id, 2, "success")
    assert host.operations().count("mutation PullRequestCreate") == 1
    [pr] = host.prs()
    assert second.branches[0].pr_url == first.branches[0].pr_url
    assert pr["body"].count(STATUS_START) == 1
    assert "**green**: all 1 CI runs passed" in pr["body"] and "**red**" not in pr["body"]
    assert "Summary of t1: added the work file." in pr["body"]
    [row] = repo.ci_rows()
    assert row["state"] == "green"


def test_a_stacked_tasks_pr_goes_against_its_parents_branch_and_says_so(
    repo: Repo, host: GitHubHost, clock: FakeClock
) -> None:
    repo.add_run(isolated=("t1", "t2", "t3"), stacked={"t2": "t1"})
    result = watch_run(repo.root, RUN_ID, config=config(host), clock=clock, out=Events())

    assert result.exit_code == 0
    prs = {pr["title"]: pr for pr in host.prs()}
    branch = {watch.target.task_id: watch.branch for watch in result.branches}
    assert (prs["Title of t1"]["base"], prs["Title of t3"]["base"]) == ("main", "main")
    assert prs["Title of t2"]["base"] == branch["t1"]
    assert f"stacked on #{prs['Title of t1']['number']} ({branch['t1']})" in prs["Title of t2"]["body"]
    assert "stacked on" not in prs["Title of t1"]["body"] + prs["Title of t3"]["body"]


def test_gh_not_logged_in_is_a_usage_error_before_any_push(
    repo: Repo, host: GitHubHost, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.add_run()
    monkeypatch.setenv("GH_ENTERPRISE_TOKEN", "ghp_wrong")
    seen = len(host.operations())
    with pytest.raises(StellaError) as caught:
        watch_run(repo.root, RUN_ID, config=config(host), clock=clock, out=Events())
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert message.startswith("gh is not authenticated (The token in GH_ENTERPRISE_TOKEN is invalid.)")
    assert "run `gh auth login`" in message and "GH_HOST and GH_ENTERPRISE_TOKEN" in message
    assert host.operations()[seen:] == []  # the one request (refused) was gh auth status's
    assert repo.remote_sha(f"fleet/t1-{RUN_ID[-4:]}") is None
    assert repo.ci_rows() == []


# --- the CLI, in real time: a quick CI and a quick poll ---


@pytest.fixture
def live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, github_host: Callable[..., GitHubHost]
) -> tuple[Repo, GitHubHost]:
    github = github_host(ci_seconds=0.6)
    repo = make_repo(
        tmp_path, monkeypatch, origin=github.local_server.state.repos[REPO].path, url=github.clone_url()
    )
    (repo.root / ".stella").mkdir(exist_ok=True)
    (repo.root / ".stella" / "config.toml").write_text(
        f'[watch]\npoll_interval = 0.1\nrepo = "{github.repo_flag}"\n'
    )
    return repo, github


def stella(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    home = repo.tmp / "home"
    return run_stella(*args, cwd=repo.root, env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})


OLDER_RUN = "r-20261130-120000-aaaa"


def test_cli_watches_the_latest_run_and_prints_json(live: tuple[Repo, GitHubHost]) -> None:
    repo, host = live
    repo.add_run(OLDER_RUN)
    repo.add_run(RUN_ID)
    proc = stella(repo, "watch", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["run_id"] == RUN_ID and document["exit_code"] == 0
    [branch] = document["branches"]
    assert branch["branch"] == f"fleet/t1-{RUN_ID[-4:]}" and branch["state"] == "green"
    assert branch["pr_url"] == f"https://{host.host}/octo/widgets/pull/1"
    [run] = branch["runs"]
    assert branch["run_urls"] == [f"https://{host.host}/octo/widgets/actions/runs/{run['id']}"]
    assert (run["workflow"], run["attempt"], run["conclusion"]) == ("CI", 1, "success")
    assert f"watch: {branch['branch']} PR #1: green: all 1 CI runs passed" in proc.stderr
    assert repo.remote_sha(branch["branch"]) == repo.shas["t1"]
    assert repo.ci_rows(OLDER_RUN) == []


def test_cli_watch_of_a_red_run_exits_4_with_a_table(live: tuple[Repo, GitHubHost]) -> None:
    repo, host = live
    repo.add_run(OLDER_RUN, ci_result="failure")
    repo.add_run(RUN_ID)
    proc = stella(repo, "watch", OLDER_RUN[:15])
    assert proc.returncode == 4, proc.stderr
    branch = f"fleet/t1-{OLDER_RUN[-4:]}"
    assert f"watch: {branch} PR #1: red: failure: CI" in proc.stdout
    header, row = proc.stdout.splitlines()[-2:]
    assert header.split()[:4] == ["branch", "PR", "state", "conclusion"]
    assert row.split()[:4] == [branch, f"https://{host.host}/octo/widgets/pull/1", "red", "failure"]
    assert repo.ci_rows(OLDER_RUN)[0]["state"] == "red"


def test_cli_watch_without_gh_login_exits_2(
    live: tuple[Repo, GitHubHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _ = live
    repo.add_run()
    monkeypatch.setenv("GH_ENTERPRISE_TOKEN", "ghp_wrong")
    proc = stella(repo, "watch")
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "stella: error: gh is not authenticated (The token in GH_ENTERPRISE_TOKEN is"
    )
    assert "Traceback" not in proc.stderr
