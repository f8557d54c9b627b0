"""A task's check on its own (run/checking.py and the Check step, in process, on real repositories and real
processes): the tree it runs in, and the checks that hang, print megabytes, fork daemons or write into the
main tree."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import psutil
import pytest
from helpers.fleet import RUN, check_attempt
from helpers.repo import add_submodule, git

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.run import checking
from stellafleet.run.steps import AttemptFailed
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")


def _ended(
    root: Path, ledger: Ledger, task: PlanTask, config: Config | None = None, **ctx: object
) -> str | None:
    """The end reason the Check step gives a succeeded attempt of task (None: it passed)."""
    step, attempt = check_attempt(root, ledger, task, config, **ctx)
    return step.ended(attempt, DONE).reason


def _before(root: Path, ledger: Ledger, check: str, config: Config | None = None) -> str | None:
    """Why check_fails_first fails a shared task before its worker starts (None: it starts)."""
    task = PlanTask("t1", "p", "t", check=check, check_fails_first=True)
    step, attempt = check_attempt(root, ledger, task, config)
    try:
        step.before_start(attempt)
    except AttemptFailed as failed:
        return failed.end.reason
    return None


def test_an_isolated_task_with_uncommitted_changes_fails_its_check_unrun(
    git_repo: Path, tmp_path: Path, ledger: Ledger
) -> None:
    worktree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(worktree), cwd=git_repo)
    (worktree / "stray.txt").write_text("it would pass only with this\n")
    task = PlanTask("t1", "p", "t", isolation="isolated", check="test -f stray.txt")
    reason = _ended(git_repo, ledger, task, workspace=worktree, isolation="isolated", branch="fleet/t1")
    assert reason == "check failed: uncommitted changes: stray.txt"
    [row] = ledger.checks.of_run(RUN)
    assert row["passed"] == 0 and row["exit_code"] is None and "stray.txt" in row["output_tail"]


def test_a_shared_tasks_check_runs_in_a_fresh_bootstrapped_checkout_of_its_last_commit(
    git_repo: Path, ledger: Ledger
) -> None:
    (git_repo / ".gitignore").write_text(".env\nsetup.out\n")
    (git_repo / ".worktreeinclude").write_text(".env\n")
    (git_repo / "work.txt").write_text("done\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "the task's commit", cwd=git_repo)
    sha = git("rev-parse", "HEAD", cwd=git_repo).strip()
    ledger.commits.record([(sha, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    (git_repo / ".env").write_text("KEY=1\n")
    (git_repo / "uncommitted.txt").write_text("another worker's edit\n")
    config = Config({"worktree": {"setup": "echo ready > setup.out"}})
    check = "test -f .env && test -f setup.out && test -f work.txt && ! test -e uncommitted.txt && pwd"
    assert _ended(git_repo, ledger, PlanTask("t1", "p", "t", check=check), config) is None
    [row] = ledger.checks.of_run(RUN)
    assert row["passed"] == 1 and row["commit_sha"] == sha
    tree = row["output_tail"].strip()
    assert tree.startswith(str(StatePaths(git_repo).private / "checks")) and not Path(tree).exists()
    assert str(tree) not in git("worktree", "list", cwd=git_repo)


@pytest.mark.parametrize("init", [True, False])
def test_a_check_tree_gets_the_main_trees_submodules_as_init_submodules_says(
    git_repo: Path, tmp_path: Path, ledger: Ledger, init: bool
) -> None:
    add_submodule(git_repo, tmp_path)
    sha = git("rev-parse", "HEAD", cwd=git_repo).strip()
    ledger.commits.record([(sha, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    config = Config({"fleet": {"init_submodules": init}})
    task = PlanTask("t1", "p", "t", check="test -f vendor/lib/lib.c && cat vendor/lib/lib.c")
    assert _ended(git_repo, ledger, task, config) == (None if init else "check failed (exit 1)")
    [row] = ledger.checks.of_run(RUN)
    assert row["passed"] == int(init) and ("int lib;" in row["output_tail"]) == init


def test_a_shared_task_that_committed_nothing_fails_its_check(git_repo: Path, ledger: Ledger) -> None:
    reason = _ended(git_repo, ledger, PlanTask("t1", "p", "t", check="true"))
    assert reason == "check failed: no commits: the task committed nothing for its check"


def _run(tmp_path: Path, command: str, **options: object) -> checking.CheckRun:
    return checking.run_check(
        command,
        tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        timeout=float(options.pop("timeout", 30.0)),  # type: ignore[arg-type]
        log_path=tmp_path / "logs" / "check.log",
        tail_bytes=int(options.pop("tail", 100)),  # type: ignore[call-overload]
        **options,  # type: ignore[arg-type]
    )


def _gone(pid_file: Path) -> bool:
    try:
        proc = psutil.Process(int(pid_file.read_text()))
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_hanging_check_is_stopped_at_its_timeout_with_its_whole_group(tmp_path: Path) -> None:
    # 2 s: under load a shorter timeout came before the shell had written child.pid
    run = _run(tmp_path, "echo started; sleep 600 & echo $! > child.pid; wait", timeout=2)
    assert run.exit_code is None and not run.passed
    assert run.failure().startswith("check failed: stopped after ") and "check_timeout is 2 s" in run.tail
    assert _gone(tmp_path / "child.pid")


def test_a_check_that_prints_megabytes_keeps_only_its_tail(tmp_path: Path) -> None:
    run = _run(tmp_path, "echo first; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo last; exit 3")
    assert run.failure() == "check failed (exit 3): last"  # no line says why: its last one
    assert len(run.tail.encode()) == 100 and run.tail.endswith("x\nlast\n")
    assert run.log_path is not None and run.log_path.stat().st_size < checking.LOG_KEEP_BYTES + 200


def test_a_daemon_the_check_forks_is_stopped_with_it(tmp_path: Path) -> None:
    command = "sleep 600 & echo $! > bg.pid; setsid sleep 600 & echo $! > daemon.pid; exit 0"
    run = _run(tmp_path, command)
    assert run.passed
    assert _gone(tmp_path / "bg.pid") and _gone(tmp_path / "daemon.pid")


def test_a_check_that_writes_into_the_main_tree_is_said_so(git_repo: Path, tmp_path: Path) -> None:
    run = _run(tmp_path, f"echo oops > {git_repo / 'written.txt'}", main_tree=git_repo)
    assert run.passed  # its result stands; what it did elsewhere is said where its output is read
    assert run.log_path is not None and run.tail.endswith("written.txt\n")
    assert "[stella] warning: the main tree changed while the check ran" in run.log_path.read_text()


@pytest.mark.parametrize(
    ("check", "codes", "said"),
    [
        ("echo 1 failed; exit 1", None, None),  # red by its own verdict: the worker starts
        ("no-such-test-runner", None, "it exited 127 (its command was not found): "),
        ("exit 2", None, "it exited 2"),
        ("exit 2", [1, 2], None),
        ("kill -SEGV $$", None, "it exited 139 (SIGSEGV)"),
    ],
)
def test_check_fails_first_counts_only_the_checks_own_verdict(
    git_repo: Path, ledger: Ledger, check: str, codes: list[int] | None, said: str | None
) -> None:
    config = Config({"fleet": {"check_fail_codes": codes}} if codes else {})
    reason = _before(git_repo, ledger, check, config)
    if said is None:
        assert reason == said
    else:
        wanted = " or ".join(str(code) for code in codes or [1])
        assert reason is not None and reason.startswith(
            "check_fails_first: the check must fail on the start commit by its verdict "
            f"(exit {wanted}); {said}"
        ), reason


def test_a_task_that_changes_the_file_its_check_runs_is_named_in_the_checks_record(
    git_repo: Path, ledger: Ledger
) -> None:
    (git_repo / "test.sh").write_text("exit 0\n")  # the task made its own test pass
    (git_repo / "other.txt").write_text("x\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "the task's commit", cwd=git_repo)
    sha = git("rev-parse", "HEAD", cwd=git_repo).strip()
    ledger.commits.record([(sha, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    assert _ended(git_repo, ledger, PlanTask("t1", "p", "t", check="sh ./test.sh")) is None
    [row] = ledger.checks.of_run(RUN)
    assert row["output_tail"].endswith("[stella] the task changed test.sh, which its check runs\n")


# vitest 4's output with its colours, as a terminal-less run in CI still prints it with FORCE_COLOR
VITEST = (
    "\x1b[7m\x1b[1m\x1b[36m RUN \x1b[39m\x1b[22m\x1b[27m \x1b[36mv4.1.5 "
    "\x1b[39m\x1b[90m/home/u/app\x1b[39m\n\n"
    " \x1b[32m✓\x1b[39m src/ok.test.ts \x1b[2m(2 tests)\x1b[22m\x1b[32m 3\x1b[2mms\x1b[22m\x1b[39m\n"
    " \x1b[31m❯\x1b[39m src/sum.test.ts \x1b[2m(1 test | \x1b[22m\x1b[31m1 failed"
    "\x1b[39m\x1b[2m)\x1b[22m 5ms\n"
    "   \x1b[31m×\x1b[39m adds 1 + 2 to equal 3\x1b[32m 3\x1b[2mms\x1b[22m\x1b[39m\n"
    "     \x1b[31m→ expected 4 to be 3 // Object.is equality\x1b[39m\n\n"
    "\x1b[31m\x1b[1m FAIL \x1b[22m\x1b[39m src/sum.test.ts\x1b[2m > \x1b[22madds 1 + 2 to equal 3\n"
    "\x1b[31m\x1b[1mAssertionError\x1b[22m: expected 4 to be 3 // Object.is equality\x1b[39m\n\n"
    "\x1b[2m Test Files \x1b[22m \x1b[1m\x1b[31m1 failed\x1b[39m\x1b[22m\x1b[2m | "
    "\x1b[22m\x1b[1m\x1b[32m1 passed\x1b[39m\x1b[22m\n"
    "\x1b[2m   Duration \x1b[22m 312ms\n"
)


def test_a_red_checks_reason_is_the_line_that_says_why_without_colour_codes(tmp_path: Path) -> None:
    (tmp_path / "vitest.out").write_text(VITEST)
    run = _run(tmp_path, "cat vitest.out; exit 1", tail=4000)
    assert run.failure() == "check failed (exit 1): × adds 1 + 2 to equal 3 3ms"
    assert "\x1b" not in run.tail and run.tail.startswith(" RUN  v4.1.5 /home/u/app\n")
    assert "\x1b[31m" in (tmp_path / "logs" / "check.log").read_text()  # the log keeps what it printed


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (
            "collected 3 items\nE       assert 4 == 3\nFAILED t.py::test_sum\n",
            "E       assert 4 == 3",
        ),
        ("ok 1\ncompiling\nsrc/a.ts(3,5): error TS2322: no\ndone\n", "src/a.ts(3,5): error TS2322: no"),
        ("building\nstill building\n\nit stopped here\n\n", "it stopped here"),
    ],
)
def test_the_reason_line_is_the_first_failure_else_the_last_line(
    tmp_path: Path, output: str, line: str
) -> None:
    assert checking.reason_line(output) == line


def test_a_checks_non_utf8_output_is_kept_readable(tmp_path: Path) -> None:
    run = _run(tmp_path, "printf 'bad \\377\\376 bytes\\n'; exit 1")
    assert (
        run.failure() == "check failed (exit 1): bad \ufffd\ufffd bytes"
        and run.tail == "bad \ufffd\ufffd bytes\n"
    )


def test_a_main_tree_change_during_a_check_is_said_as_maybe_anothers_and_old_dirt_is_not(
    git_repo: Path, tmp_path: Path
) -> None:
    (git_repo / "README.md").write_text("the user's edit, before the check\n")
    run = _run(tmp_path, f"echo oops > {git_repo / 'written.txt'}", main_tree=git_repo)
    assert run.log_path is not None
    [said] = [line for line in run.log_path.read_text().splitlines() if line.startswith("[stella]")]
    assert said.startswith(
        "[stella] warning: the main tree changed while the check ran "
        "(by it or by another process; it runs in "
    )
    assert said.endswith("): written.txt")  # README.md was dirty before it: not named


def test_a_check_runs_with_the_real_git_and_none_of_the_workers_secrets() -> None:
    guard = "/state/gitguard"
    kept = {
        "STELLA_ROOT": "/repo",
        "STELLA_RUN_ID": "r-1",
        "STELLA_TASK_ID": "t1",
        "STELLA_WORKTREE_INDEX": "3",
        "HOME": "/home/u",
        "NODE_OPTIONS": "--max-old-space-size=4096",
    }
    secrets = {"STELLA_TOKEN": "secret", "STELLA_PROMPT": "the worker's prompt"}
    env = {**kept, **secrets, "PATH": f"{guard}:/usr/bin:/bin", "STELLA_GIT_GUARD": guard}
    # the guard off PATH with its variable: a check's git is the real one
    assert checking.check_env(env) == {**kept, "PATH": "/usr/bin:/bin"}


def test_a_check_whose_shell_cannot_start_fails_by_name(tmp_path: Path) -> None:
    run = checking.run_check(
        "true", tmp_path / "gone", env={}, timeout=5, log_path=tmp_path / "check.log", tail_bytes=100
    )
    assert run.exit_code is None and not run.passed
    assert run.failure().startswith("check failed: could not start /bin/sh: ")


def test_a_running_checks_journal_record_names_its_process_and_tree_and_goes(
    git_repo: Path, ledger: Ledger
) -> None:
    sha = git("rev-parse", "HEAD", cwd=git_repo).strip()
    ledger.commits.record([(sha, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    journal = StatePaths(git_repo).journal
    assert _ended(git_repo, ledger, PlanTask("t1", "p", "t", check=f"cat {journal}/check-*.json")) is None
    [row] = ledger.checks.of_run(RUN)
    record = json.loads(row["output_tail"])
    assert record["kind"] == checking.RECORD and record["path"].startswith(str(StatePaths(git_repo).private))
    pid, started_at = record["check"]
    assert pid > 0 and started_at > 0
    assert not list(journal.glob("check-*.json"))  # dropped once the check ended


def test_repair_stops_a_killed_fleets_check_and_removes_its_tree(git_repo: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    git("worktree", "add", "-q", "--detach", str(tree), cwd=git_repo)
    check = subprocess.Popen(["sleep", "60"], start_new_session=True)
    reaped = threading.Thread(target=check.wait)  # no zombie of ours for the repair to wait on
    reaped.start()
    who = ProcessIdentity.of(check.pid)
    assert who is not None
    data = {"pid": 1, "path": str(tree), "check": [who.pid, who.started_at]}
    assert checking.repair(git_repo, [journal.Record(tmp_path / "r.json", data)])
    reaped.join(timeout=10)
    assert check.returncode is not None and not tree.exists()
    assert str(tree) not in git("worktree", "list", cwd=git_repo)
