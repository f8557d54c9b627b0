"""stella watch's own logic on real repositories (a bare repository as origin) with a fake clock and the
in-process FakeGh: it stands in for gh here because these cases are ones the real gh cannot be made to
produce against the local GitHub API server (cancelled, timed-out and unknown conclusions, CI that
stalls or never appears, gh blips, a push the remote rejects). What gh itself does is tested with the
real gh in test_watch_real_gh.py, test_real_gh_calls.py and test_real_gh_watch.py."""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.repo import run_stella
from helpers.watchrepo import RUN_ID, Repo, git, make_repo

from stellafleet.ci.gh import GH_MISSING, STATUS_START, SystemGh
from stellafleet.ci.watch import BranchWatch, ConsoleReporter, WatchResult, branches_to_watch, watch_run
from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.fake_gh import FakeGh


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repo]:
    yield make_repo(tmp_path, monkeypatch)


def run_snapshot(**fields: Any) -> list[dict[str, Any]]:
    return [{"databaseId": 501, "name": "build", "workflowName": "CI", **fields}]


QUEUED = run_snapshot(status="queued", conclusion="", updatedAt="2026-11-30T12:00:00Z")
IN_PROGRESS = run_snapshot(status="in_progress", conclusion="", updatedAt="2026-11-30T12:01:00Z")
SUCCESS = run_snapshot(status="completed", conclusion="success", updatedAt="2026-11-30T12:05:00Z")
FAILURE = run_snapshot(status="completed", conclusion="failure", updatedAt="2026-11-30T12:05:00Z")


class Events:
    """A WatchReporter that keeps what it is told, with the fake clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.changes: list[tuple[float, str, str, str]] = []
        self.notes: list[str] = []
        self.result: WatchResult | None = None

    def note(self, message: str) -> None:
        self.notes.append(message)

    def changed(self, watch: BranchWatch) -> None:
        self.changes.append((self.clock.now(), watch.branch, watch.state, watch.phase))

    def finished(self, result: WatchResult) -> None:
        self.result = result


def watch_in_process(
    repo: Repo, script: dict[str, Any], **settings: Any
) -> tuple[WatchResult, FakeGh, Events]:
    clock = FakeClock()
    gh = FakeGh(script)
    events = Events(clock)
    result = watch_run(
        repo.root,
        RUN_ID,
        config=Config({"watch": settings}),
        clock=clock,
        gh=gh,
        out=events,
    )
    return result, gh, events


def commands(calls: list[list[str]]) -> list[str]:
    return [" ".join(args[:2]) for args in calls]


# --- CI outcomes ---


def test_red_on_failure(repo: Repo) -> None:
    repo.add_run()
    result, _, _ = watch_in_process(repo, {"runs": {repo.shas["t1"]: [IN_PROGRESS, FAILURE]}})
    [branch] = result.branches
    assert result.exit_code == 4
    assert (branch.state, branch.conclusion, branch.reason) == ("red", "failure", "failure: CI / build")
    [row] = repo.ci_rows()
    assert (row["state"], row["conclusion"]) == ("red", "failure")
    assert result.to_json()["branches"][0]["state"] == "red"


def test_cancelled_run_is_red_with_its_own_label(repo: Repo) -> None:
    repo.add_run()
    cancelled = run_snapshot(status="completed", conclusion="cancelled")
    other = {"databaseId": 502, "name": "lint", "status": "completed", "conclusion": "success"}
    result, _, _ = watch_in_process(repo, {"runs": {repo.shas["t1"]: [[*cancelled, other]]}})
    [branch] = result.branches
    assert (branch.state, branch.conclusion) == ("red", "cancelled")
    assert result.exit_code == 4
    assert repo.ci_rows()[0]["conclusion"] == "cancelled"


def test_rerun_attempt_supersedes_the_failed_attempt(repo: Repo) -> None:
    repo.add_run()
    first = run_snapshot(attempt=1, status="completed", conclusion="failure", updatedAt="t1")
    rerun_running = run_snapshot(attempt=2, status="in_progress", conclusion="", updatedAt="t2")
    rerun_passed = run_snapshot(attempt=2, status="completed", conclusion="success", updatedAt="t3")
    script = {"runs": {repo.shas["t1"]: [[*first, *rerun_running], [*rerun_passed, *first]]}}
    result, _, events = watch_in_process(repo, script)
    [branch] = result.branches
    assert (branch.state, branch.conclusion) == ("green", "success")
    assert [r.attempt for r in branch.runs] == [2]
    assert "red" not in [state for _, _, state, _ in events.changes]


# --- giving up ---


def test_ci_that_never_appears_is_given_up_after_ten_minutes(repo: Repo) -> None:
    repo.add_run()
    result, gh, events = watch_in_process(repo, {"runs": {}})
    [branch] = result.branches
    assert branch.state == "no_ci" and result.exit_code == 4
    assert events.clock.now() == 600.0
    assert result.to_json()["branches"][0]["elapsed_s"] == 600.0
    assert commands(gh.calls).count("run list") == 21  # 0 s, 30 s, ..., 600 s
    assert "within 10m00s" in (branch.reason or "")
    assert repo.ci_rows()[0]["state"] == "no_ci"


def test_ci_without_progress_is_given_up_as_stalled_after_twenty_minutes(repo: Repo) -> None:
    repo.add_run()
    result, _, events = watch_in_process(repo, {"runs": {repo.shas["t1"]: [QUEUED]}})
    [branch] = result.branches
    assert branch.state == "stalled" and result.exit_code == 4
    assert events.clock.now() == 1200.0
    assert branch.reason == "no CI progress for 20m00s (0/1 runs complete (1 queued))"
    assert repo.ci_rows()[0]["state"] == "stalled"


def test_progress_resets_the_stall_timer(repo: Repo) -> None:
    repo.add_run()
    # queued for 15 minutes, then running and unchanged: stalled 20 minutes after the last change
    snapshots = [QUEUED] * 30 + [IN_PROGRESS]  # calls at 0 s .. 870 s queued, at 900 s running
    result, _, events = watch_in_process(repo, {"runs": {repo.shas["t1"]: snapshots}})
    assert result.branches[0].state == "stalled"
    assert events.clock.now() == 900.0 + 1200.0


def test_long_but_progressing_run_is_watched_until_two_hours(repo: Repo) -> None:
    repo.add_run()
    ticking = run_snapshot(status="in_progress", conclusion="", updatedAt="2026-11-30T12:00:00Z #{n}")
    result, gh, events = watch_in_process(repo, {"runs": {repo.shas["t1"]: [ticking]}})
    [branch] = result.branches
    assert (branch.state, branch.conclusion) == ("red", "timeout")
    assert events.clock.now() == 7200.0
    ends = [t for t, _, state, _ in events.changes if state != "pending"]
    assert ends == [7200.0]  # not given up a moment earlier
    assert commands(gh.calls).count("run list") == 241
    assert "after 2h00m" in (branch.reason or "")
    assert result.exit_code == 4


def test_limits_come_from_config(repo: Repo) -> None:
    repo.add_run()
    result, _, events = watch_in_process(repo, {"runs": {}}, poll_interval=5, appear_timeout=20)
    assert result.branches[0].state == "no_ci"
    assert events.clock.now() == 20.0
    assert set(events.clock.sleeps) == {5.0}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("poll_interval", 0),
        ("stall_timeout", "soon"),
        ("remote", ""),
        ("force_push", "yes"),
        ("total_timeout", True),
    ],
)
def test_bad_watch_config_is_a_usage_error(key: str, value: Any) -> None:
    with pytest.raises(StellaError, match=f"config: watch.{key} must be") as caught:
        _ = Config({"watch": {key: value}}).watch
    assert caught.value.exit_code == 2


def test_a_gh_blip_while_polling_is_retried(repo: Repo) -> None:
    repo.add_run()
    blip = {"exit": 1, "stderr": "error connecting to api.github.com\n"}
    result, _, events = watch_in_process(repo, {"runs": {repo.shas["t1"]: [blip, IN_PROGRESS, SUCCESS]}})
    assert result.branches[0].state == "green"
    assert any("error connecting to api.github.com (will retry)" in note for note in events.notes)


# --- pull requests ---


def test_existing_pr_without_status_block_gets_one_appended(repo: Repo) -> None:
    repo.add_run()
    branch = f"fleet/t1-{RUN_ID[-4:]}"
    script = {
        "prs": [{"number": 12, "headRefName": branch, "body": "Written by hand."}],
        "runs": {"*": [SUCCESS]},
    }
    result, gh, _ = watch_in_process(repo, script)
    assert result.branches[0].pr_number == 12
    assert "pr create" not in commands(gh.calls)
    [pr] = gh.prs
    assert pr["body"].startswith("Written by hand.\n\n" + STATUS_START)


def test_a_new_pr_body_carries_the_runs_of_the_tasks_check(repo: Repo) -> None:
    repo.add_run()
    with Ledger.open(repo.db) as ledger:
        for phase, code, said in (("before", 1, "1 failed"), ("after", 0, "12 passed")):
            ledger.checks.add(
                run_id=RUN_ID, task_id="t1", phase=phase, command="make test", exit_code=code,
                duration_ms=1500, commit=repo.shas["t1"], output_tail=f"ok\n{said}\n", log_path=None,
            )  # fmt: skip
    _, gh, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    [pr] = gh.prs
    assert "### Check (run by stella)" in pr["body"]
    sha = repo.shas["t1"][:12]
    assert (
        f"- before on `{sha}`: `make test` exit 1 in 1.5 s\n- after on `{sha}`: `make test` passed"
        in pr["body"]
    )
    assert "12 passed" in pr["body"] and "1 failed" not in pr["body"]  # the last run's output


def test_no_pr_for_the_default_branch(repo: Repo) -> None:
    repo.add_run(isolated=(), shared=("s1", "s2"))
    result, gh, _ = watch_in_process(repo, {"runs": {"*": [IN_PROGRESS, SUCCESS]}})
    [branch] = result.branches
    assert branch.branch == "main" and branch.state == "green" and branch.pr_url is None
    assert not [c for c in commands(gh.calls) if c.startswith("pr ")]
    assert repo.remote_sha("main") == repo.shas["s2"]
    [row] = repo.ci_rows()
    assert row["pr_url"] is None and row["task_id"] is None and row["state"] == "green"


def test_isolated_and_shared_branches_are_watched_together(repo: Repo) -> None:
    repo.add_run(isolated=("t1", "t2"), shared=("s1",), failed=("t2",), shared_branch="feature")
    script = {"runs": {repo.shas["t1"]: [SUCCESS], repo.shas["s1"]: [IN_PROGRESS, FAILURE]}}
    result, gh, _ = watch_in_process(repo, script)
    by_branch = {b.branch: b for b in result.branches}
    isolated = f"fleet/t1-{RUN_ID[-4:]}"
    assert set(by_branch) == {isolated, "feature"}  # the failed t2 is not watched
    assert by_branch["feature"].state == "red" and by_branch[isolated].state == "green"
    assert result.exit_code == 4
    # a shared branch that is not the default one gets its pull request too, titled after its task
    assert {pr["headRefName"]: pr["title"] for pr in gh.prs} == {
        isolated: "Title of t1",
        "feature": "Title of s1",
    }


def test_branches_to_watch_reads_the_ledger(repo: Repo) -> None:
    repo.add_run(isolated=("t1", "t2"), shared=("s1",), failed=("t2",))
    with Ledger.open(repo.db) as ledger:
        targets = branches_to_watch(ledger.get_run(RUN_ID))
    assert [(t.branch, t.kind, [w.id for w in t.tasks]) for t in targets] == [
        (f"fleet/t1-{RUN_ID[-4:]}", "isolated", ["t1"]),
        ("main", "shared", ["s1"]),
    ]
    assert targets[0].tasks[0].spend_usd == pytest.approx(0.42)


# --- preflight and push failures: a clear message, nothing recorded as success ---


def test_nothing_to_watch(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    repo.add_run(isolated=("t1",), failed=("t1",))
    monkeypatch.setenv("PATH", str(repo.tmp / "empty"))  # not even gh: it is not needed
    events = Events(FakeClock())
    result = watch_run(repo.root, RUN_ID, config=Config(), clock=events.clock, out=events)
    assert result.exit_code == 0 and result.branches == []
    assert events.notes == [
        f"nothing to watch: no branch of run {RUN_ID} holds committed work of a succeeded task"
    ]


def test_gh_missing_is_a_usage_error_before_any_push(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    repo.add_run()
    (repo.tmp / "empty").mkdir()
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(repo.tmp / "empty"))
    with pytest.raises(StellaError) as caught:
        watch_run(
            repo.root, RUN_ID, config=Config(), clock=FakeClock(), gh=SystemGh(), out=Events(FakeClock())
        )
    assert caught.value.exit_code == 2
    assert str(caught.value) == GH_MISSING
    monkeypatch.setenv("PATH", path)
    assert repo.remote_sha(f"fleet/t1-{RUN_ID[-4:]}") is None
    assert repo.ci_rows() == []


def test_no_remote_to_push_to(repo: Repo) -> None:
    repo.add_run()
    git("remote", "remove", "origin", cwd=repo.root)
    with pytest.raises(StellaError, match="no git remote named 'origin' to push to: add one") as caught:
        watch_in_process(repo, {})
    assert caught.value.exit_code == 2
    assert repo.ci_rows() == []
    git("remote", "add", "upstream", str(repo.origin), cwd=repo.root)
    result, _, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}}, remote="upstream")
    assert result.exit_code == 0 and result.remote == "upstream"


def test_no_remote_names_the_config_file_the_setting_goes_in(repo: Repo, tmp_path: Path) -> None:
    repo.add_run()
    git("remote", "remove", "origin", cwd=repo.root)
    given = str(tmp_path / "ci.toml")  # as `stella --config ci.toml` makes it (Config.settings_file)
    with pytest.raises(StellaError) as caught:
        watch_run(
            repo.root,
            RUN_ID,
            config=Config({}, settings_file=given),
            clock=FakeClock(),
            gh=FakeGh({}),
            out=Events(FakeClock()),
        )
    assert str(caught.value).endswith(f'`remote = "NAME"` under [watch] in {given}')


def test_push_rejected_by_the_remote(repo: Repo) -> None:
    repo.add_run()
    hook = repo.origin / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'fleet branches need a review first' >&2\nexit 1\n")
    hook.chmod(0o755)
    result, gh, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    [branch] = result.branches
    assert result.exit_code == 4
    assert branch.state == "error" and branch.conclusion is None
    assert "was rejected: [remote rejected] (pre-receive hook declined)" in (branch.reason or "")
    assert "fleet branches need a review first" in (branch.reason or "")
    assert commands(gh.calls) == ["auth status"]  # no PR, no polling
    assert repo.remote_sha(branch.branch) is None
    [row] = repo.ci_rows()
    assert row["state"] == "error" and row["pr_url"] is None


def test_unreachable_remote_says_why_the_push_failed(repo: Repo) -> None:
    repo.add_run()
    git("remote", "set-url", "origin", str(repo.tmp / "no-such-remote.git"), cwd=repo.root)
    result, gh, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    [branch] = result.branches
    assert result.exit_code == 4 and branch.state == "error"
    # git's first fatal line, not the tail of its advice ("and the repository exists.")
    assert branch.reason == (
        f"push of {branch.branch} to origin failed: fatal: "
        f"'{repo.tmp / 'no-such-remote.git'}' does not appear to be a git repository"
    )
    assert commands(gh.calls) == ["auth status"]


def test_diverged_remote_branch_is_not_overwritten_unless_force_push(repo: Repo) -> None:
    repo.add_run()
    branch = f"fleet/t1-{RUN_ID[-4:]}"
    other = repo.tmp / "other"
    git("clone", "-q", str(repo.origin), str(other), cwd=repo.tmp)
    git("switch", "-q", "-c", branch, cwd=other)
    (other / "theirs.txt").write_text("someone else\n")
    git("add", "theirs.txt", cwd=other)
    git("commit", "-qm", "theirs", cwd=other)
    git("push", "-q", "origin", branch, cwd=other)
    theirs = repo.remote_sha(branch)

    result, _, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    assert result.branches[0].state == "error" and "rejected" in (result.branches[0].reason or "")
    assert repo.remote_sha(branch) == theirs

    result, _, _ = watch_in_process(repo, {"runs": {"*": [SUCCESS]}}, force_push=True)
    assert result.branches[0].state == "green"
    assert repo.remote_sha(branch) == repo.shas["t1"]


def test_a_failing_pr_create_ends_the_branch_in_error(repo: Repo) -> None:
    repo.add_run()
    refusal = {"exit": 1, "stderr": "pull request create failed: GraphQL: Resource not accessible\n"}
    result, gh, _ = watch_in_process(repo, {"replies": {"pr create": [refusal]}, "runs": {"*": [SUCCESS]}})
    [branch] = result.branches
    assert branch.state == "error" and "Resource not accessible" in (branch.reason or "")
    assert "run list" not in commands(gh.calls)
    assert repo.ci_rows()[0]["state"] == "error"
    assert result.exit_code == 4


# --- the command line ---


def stella(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    home = repo.tmp / "home"
    return run_stella(*args, cwd=repo.root, env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})


def test_cli_watch_with_no_runs_yet(repo: Repo) -> None:
    proc = stella(repo, "watch")
    assert proc.returncode == 2
    assert "nothing to watch" in proc.stderr


class TerminalBuffer(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_output_is_styled_and_ends_with_a_table(repo: Repo) -> None:
    repo.add_run()
    buffer = TerminalBuffer()
    result = watch_run(
        repo.root,
        RUN_ID,
        config=Config(),
        clock=FakeClock(),
        gh=FakeGh({"runs": {"*": [QUEUED, SUCCESS]}}),
        out=ConsoleReporter(buffer),
    )
    assert result.exit_code == 0
    text = buffer.getvalue()
    assert "\x1b[" in text  # styled
    assert "watch: run " + RUN_ID in text and "conclusion" in text
    branch = result.branches[0].branch
    changes = [line for line in text.splitlines() if line.startswith(f"\x1b[1m{branch}")]
    assert len(changes) == 3  # pushed, queued, green: one line per change


def test_a_gh_failure_after_runs_appeared_does_not_forget_them(repo: Repo) -> None:
    # Runs appeared, then `gh run list` failed for 12.5 minutes (past the 10-minute appear timeout):
    # the runs seen so far still stand, so the branch is neither "no CI" nor waiting for runs to appear.
    repo.add_run()
    blip = {"exit": 1, "stderr": "HTTP 502: Bad Gateway\n"}
    snapshots = [QUEUED, IN_PROGRESS] + [blip] * 25 + [SUCCESS]
    result, _, events = watch_in_process(repo, {"runs": {repo.shas["t1"]: snapshots}})
    [branch] = result.branches
    assert (branch.state, branch.conclusion) == ("green", "success"), branch.reason
    assert events.clock.now() == 27 * 30.0
    after_appearing = [phase for t, _, _, phase in events.changes if t >= 30.0]
    assert "waiting for CI runs to appear" not in after_appearing
    assert any("HTTP 502: Bad Gateway (will retry)" in note for note in events.notes)


def test_the_watch_says_first_that_it_pushes_the_branch_shared_tasks_committed_on(repo: Repo) -> None:
    repo.add_run(isolated=("t1",), shared=("s1",))
    _, _, events = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    assert events.notes == [f"will push main to origin: shared tasks of run {RUN_ID} committed on it"]
    assert repo.remote_sha("main") == repo.shas["s1"]


def test_watching_an_old_run_says_the_tip_it_pushes_holds_later_commits(repo: Repo) -> None:
    repo.add_run(isolated=(), shared=("s1",))
    git("switch", "-q", "main", cwd=repo.root)
    for n in (1, 2):  # a later run's work on main, after this run's
        (repo.root / f"later{n}.txt").write_text("later\n")
        git("add", f"later{n}.txt", cwd=repo.root)
        git("commit", "-qm", f"later {n}", cwd=repo.root)
    tip = git("rev-parse", "main", cwd=repo.root)
    _, _, events = watch_in_process(repo, {"runs": {"*": [SUCCESS]}})
    assert events.notes[1] == (
        f"main's tip {tip[:12]} holds 2 commits made after run {RUN_ID}'s: they are pushed with it"
    )
    assert repo.remote_sha("main") == tip


@pytest.mark.parametrize(
    ("url", "repo"),
    [
        ("https://x-access-token:t@localhost:8443/octo/widgets.git", "localhost:8443/octo/widgets"),
        ("https://ghe.example.com:8443/octo/widgets", "ghe.example.com:8443/octo/widgets"),
        ("https://github.com/octo/widgets.git", None),  # gh finds it from the remote itself
        ("ssh://git@ghe.example.com:2222/octo/widgets.git", None),  # an ssh port is not the API's
        ("git@github.com:octo/widgets.git", None),
        ("https://localhost:8443/not-a-repo", None),
    ],
)
def test_gh_is_told_the_repository_of_a_remote_whose_host_has_a_port(url: str, repo: str | None) -> None:
    from stellafleet.ci.gh import repo_with_port

    assert repo_with_port(url) == repo
