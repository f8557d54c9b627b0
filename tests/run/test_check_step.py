"""The Check step's decisions in process (run/steps/check.py), on real repositories and real checks: the
prompt it adds to, the commit it checks, a run stopped mid-check, the rounds it gives, check_fails_first
in a task's own worktree, a check tree whose setup fails (issue 49 item 18's survivors)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.fleet import RUN, check_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome, FollowUpReason, StopReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.checking import CheckRun
from stellafleet.run.steps import AttemptFailed, FollowUp, Request
from stellafleet.run.steps.check import VACUOUS, no_verdict, round_context, runs_changed, told
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")


def _commit(root: Path, name: str, text: str | None = None) -> str:
    (root / name).write_text(f"{name}\n" if text is None else text)
    git("add", name, cwd=root)
    git("commit", "-q", "-m", name, cwd=root)
    return git("rev-parse", "HEAD", cwd=root).strip()


def test_the_check_note_is_added_to_the_prompt_not_put_in_its_place(git_repo: Path, ledger: Ledger) -> None:
    step, attempt = check_attempt(
        git_repo, ledger, PlanTask("t1", "write the parser", "t", check="make test")
    )
    step.admit(attempt)
    assert attempt.prompt == "write the parser" + told("make test", isolated=False)
    assert "the shared branch right after your last commit" in attempt.prompt


def test_a_shared_task_is_checked_on_its_own_last_commit_not_on_head(git_repo: Path, ledger: Ledger) -> None:
    mine = _commit(git_repo, "mine.txt")
    ledger.commits.record([(mine, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    _commit(git_repo, "another.txt")  # another worker's, after it
    step, attempt = check_attempt(git_repo, ledger, PlanTask("t1", "p", "t", check="test ! -e another.txt"))
    assert step.ended(attempt, DONE).reason is None
    [row] = ledger.checks.of_run(RUN)
    assert row["commit_sha"] == mine


def test_a_run_stopped_mid_check_interrupts_the_attempt(
    git_repo: Path, tmp_path: Path, ledger: Ledger
) -> None:
    ledger.commits.record(
        [(_commit(git_repo, "a.txt"), "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main"
    )
    started = tmp_path / "started"
    step, attempt = check_attempt(
        git_repo, ledger, PlanTask("t1", "p", "t", check=f"touch {started}; sleep 60")
    )

    def stop_once_started() -> None:
        while not started.exists():
            time.sleep(0.01)
        attempt.stopping.set()

    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    end = step.ended(attempt, DONE)
    stopper.join()
    assert end.outcome == AttemptOutcome.INTERRUPTED and end.reason == "interrupted in its check"
    assert step.released(attempt) is None  # no round for a stopped run
    [row] = ledger.checks.of_run(RUN)
    assert row["exit_code"] is None and "the run is being stopped" in row["output_tail"]


def test_check_rounds_caps_the_rounds_then_it_waits_on_a_person(git_repo: Path, ledger: Ledger) -> None:
    ledger.commits.record(
        [(_commit(git_repo, "a.txt"), "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main"
    )
    task = PlanTask("t1", "p", "t", check="echo 'FAIL parser'; exit 1", check_rounds=2)
    step, attempt = check_attempt(git_repo, ledger, task)
    rounds = []
    for _ in range(3):
        end = step.ended(attempt, DONE)
        assert end.outcome == AttemptOutcome.FAILED and end.reason == "check failed (exit 1): FAIL parser"
        follow_up = step.released(attempt)
        assert follow_up is not None and follow_up.reason == FollowUpReason.CHECK
        rounds.append(follow_up)
        asked = ledger.requests.ask(RUN, "t1", FollowUpReason.CHECK, follow_up.context, asked_by="check")
        assert ledger.requests.take(asked)  # served: it counts as a round given
    assert [follow_up.needs_you for follow_up in rounds] == [False, False, True]
    assert "check round 1 of at most 2" in rounds[0].context
    assert "check round 2 of at most 2" in rounds[1].context
    assert rounds[2].context.startswith(
        "check `echo 'FAIL parser'; exit 1` is red (check failed (exit 1): FAIL"
    )


def test_check_fails_first_runs_in_an_isolated_tasks_own_worktree(
    git_repo: Path, tmp_path: Path, ledger: Ledger
) -> None:
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=git_repo)
    own = _commit(tree, "own.txt")  # its worktree's start is not the main tree's HEAD
    elsewhere = PlanTask("t1", "p", "t", isolation="isolated", check=f'test "$(pwd)" != "{tree}"')
    here = PlanTask("t2", "p", "t", isolation="isolated", check=f'test "$(pwd)" = "{tree}"')
    on_branch = {"workspace": tree, "isolation": "isolated", "branch": "fleet/t1"}
    step, attempt = check_attempt(git_repo, ledger, replace(elsewhere, check_fails_first=True), **on_branch)
    step.before_start(attempt)  # red in its own worktree, by its verdict: the worker starts
    step, attempt = check_attempt(git_repo, ledger, replace(here, check_fails_first=True), **on_branch)
    with pytest.raises(AttemptFailed) as failed:
        step.before_start(attempt)
    assert failed.value.end.reason == VACUOUS
    [row] = [row for row in ledger.checks.of_run(RUN) if row["task_id"] == "t2"]
    assert row["phase"] == "before" and row["commit_sha"] == own


def test_a_check_tree_whose_setup_fails_fails_the_check_and_goes(git_repo: Path, ledger: Ledger) -> None:
    ledger.commits.record(
        [(_commit(git_repo, "a.txt"), "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main"
    )
    config = Config({"worktree": {"setup": "echo cannot install; exit 3"}})
    step, attempt = check_attempt(git_repo, ledger, PlanTask("t1", "p", "t", check="true"), config)
    reason = step.ended(attempt, DONE).reason
    assert reason is not None and reason.startswith("check failed: its check tree: "), reason
    [row] = ledger.checks.of_run(RUN)
    assert row["exit_code"] is None and row["passed"] == 0
    assert not list((StatePaths(git_repo).private / "checks").iterdir())
    assert git("worktree", "list", "--porcelain", cwd=git_repo).count("worktree ") == 1


@pytest.mark.parametrize(
    ("command", "changed", "named"),
    [
        ("sh ./test.sh", ["a.py", "test.sh"], "test.sh"),
        ("pytest -q tests/test_p.py::test_nested", ["tests/test_p.py"], "tests/test_p.py"),
        ("node --test-file=spec/a.js", ["spec/a.js", "spec/b.js"], "spec/a.js"),
        ("pytest tests", ["tests/test_new.py"], None),  # a folder: adding tests there is the task's job
        ("make 'test", ["test"], None),  # no closing quote: read word by word, and `'test` names no file
        ("node --spec=cases=a.js", ["cases=a.js"], "cases=a.js"),  # the option's value is all after its `=`
        ("sh test.sh lib.sh", ["lib.sh", "test.sh"], "lib.sh, test.sh"),
    ],
)
def test_a_file_the_check_command_names_is_the_one_named(
    command: str, changed: list[str], named: str | None
) -> None:
    said = runs_changed(command, changed)
    assert said == (None if named is None else f"the task changed {named}, which its check runs")


def test_an_isolated_task_that_changes_its_checks_script_is_named(
    git_repo: Path, tmp_path: Path, ledger: Ledger
) -> None:
    start = git("rev-parse", "HEAD", cwd=git_repo).strip()
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=git_repo)
    _commit(tree, "check.sh")  # `check.sh\n` as a script: it runs the command `check.sh`, not found
    task = PlanTask("t1", "p", "t", isolation="isolated", check="sh check.sh || true")
    on_branch = {"workspace": tree, "isolation": "isolated", "branch": "fleet/t1", "base_commit": start}
    step, attempt = check_attempt(git_repo, ledger, task, **on_branch)
    assert step.ended(attempt, DONE).reason is None
    [row] = ledger.checks.of_run(RUN)
    assert row["output_tail"].endswith("[stella] the task changed check.sh, which its check runs\n")


def _red(exit_code: int | None, problem: str | None = None, reason_line: str = "") -> CheckRun:
    return CheckRun("make test", exit_code, 0.1, "a" * 40, "", None, problem, reason_line)


FIRST = "check_fails_first: the check must fail on the start commit by its verdict"


@pytest.mark.parametrize(
    ("run", "codes", "said"),
    [
        (_red(1, reason_line="FAIL t"), (1,), None),
        (
            _red(1, problem="the check moved fleet/t1 from a to b"),
            (1,),
            "(exit 1); the check moved fleet/t1 from a to b",
        ),
        (_red(None), (1,), "(exit 1); it gave no exit code"),
        (_red(2), (1,), "(exit 1); it exited 2"),
        (_red(3, reason_line="E boom"), (1, 2), "(exit 1 or 2); it exited 3: E boom"),
        (_red(129), (1,), "(exit 1); it exited 129 (SIGHUP)"),
        (_red(200), (1,), "(exit 1); it exited 200"),  # no signal 72: no name
    ],
)
def test_a_check_that_fails_first_by_no_verdict_of_its_own_is_named_as_it_failed(
    run: CheckRun, codes: Sequence[int], said: str | None
) -> None:
    assert no_verdict(run, codes) == (None if said is None else f"{FIRST} {said}")


def test_the_check_note_says_where_the_check_runs(git_repo: Path, ledger: Ledger) -> None:
    assert "on your committed work (your branch's tip), in a clean checkout: `make`" in told("make", True)
    shared = "(the shared branch right after your last commit)"
    assert shared in told("make", False) and shared not in told("make", True)
    task = PlanTask("t1", "write the parser", "t", isolation="isolated", check="make test")
    step, attempt = check_attempt(git_repo, ledger, task, isolation="isolated", branch="fleet/t1")
    step.admit(attempt)
    assert attempt.prompt == "write the parser" + told("make test", isolated=True)


def test_a_check_rounds_prompt_names_the_red_commit_and_what_to_do() -> None:
    red = replace(_red(1, reason_line="FAIL t"), tail="FAIL t\n")
    assert round_context(red, 2, 3) == (
        "stella ran your check `make test` on commit aaaaaaaaaaaa and it is red (check failed (exit 1): "
        "FAIL t). This is check round 2 of at most 3. Find the cause in its output below, fix it in this "
        "workspace and commit the fix; the check runs again on your committed work.\n\n"
        "The check's output (its end):\n```\nFAIL t\n\n```\n"
    )
    assert round_context(replace(red, commit=None), 2, 3).startswith(
        "stella ran your check `make test` and it is red (check failed (exit 1): FAIL t). "
    )


def test_check_fails_first_runs_only_when_asked_and_not_for_a_follow_up(
    git_repo: Path, ledger: Ledger
) -> None:
    red = "echo 'FAIL t'; exit 1"
    step, attempt = check_attempt(git_repo, ledger, PlanTask("t1", "p", "t", check="true"))
    step.before_start(attempt)  # it would pass: only check_fails_first runs it here
    task = PlanTask("t2", "p", "t", check="true", check_fails_first=True)
    step, attempt = check_attempt(git_repo, ledger, task)
    attempt.request = Request(1, FollowUp(FollowUpReason.CHECK, "a round"))
    step.before_start(attempt)  # a check round: the start commit was checked by the first attempt
    assert ledger.checks.of_run(RUN) == []
    step, attempt = check_attempt(git_repo, ledger, replace(task, id="t3", check=red))
    step.before_start(attempt)
    assert [row["task_id"] for row in ledger.checks.of_run(RUN)] == ["t3"]


def test_a_run_stopped_in_check_fails_first_interrupts_the_attempt(git_repo: Path, ledger: Ledger) -> None:
    task = PlanTask("t1", "p", "t", check="sleep 60", check_fails_first=True)
    step, attempt = check_attempt(git_repo, ledger, task)
    attempt.stopping.set()
    with pytest.raises(AttemptFailed) as failed:
        step.before_start(attempt)
    interrupted = AttemptEnd(
        AttemptOutcome.INTERRUPTED, "interrupted in its check", StopReason.INTERRUPTED.value
    )
    assert failed.value.end == interrupted


def test_a_remote_tasks_check_runs_on_its_start_and_its_fetched_branch(
    git_repo: Path, tmp_path: Path, ledger: Ledger
) -> None:
    base = git("rev-parse", "HEAD", cwd=git_repo).strip()
    _commit(git_repo, "later.txt")  # main moved after the run's base: the remote worker starts at the base
    task = PlanTask("t1", "p", "t", isolation="isolated", check="test -f later.txt", check_fails_first=True)
    remote = {"workspace": tmp_path / "on-a-node", "isolation": "isolated", "branch": "fleet/t1"}
    step, attempt = check_attempt(git_repo, ledger, task, base_commit=base, **remote)
    attempt.remote = True
    step.before_start(attempt)  # red on its start (no later.txt there): the worker starts
    git("branch", "fleet/t1", "HEAD", cwd=git_repo)  # its branch, fetched back from the node
    git("reset", "-q", "--hard", base, cwd=git_repo)
    assert step.ended(attempt, DONE).reason is None
    before, after = ledger.checks.of_run(RUN)
    assert before["commit_sha"] == base and before["passed"] == 0
    assert after["commit_sha"] == git("rev-parse", "fleet/t1", cwd=git_repo).strip() and after["passed"] == 1


def test_a_check_runs_only_on_a_succeeded_attempt_and_is_its_attempts_row(
    git_repo: Path, ledger: Ledger
) -> None:
    ledger.commits.record(
        [(_commit(git_repo, "a.txt"), "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main"
    )
    step, attempt = check_attempt(git_repo, ledger, PlanTask("t1", "p", "t", check="true"))
    failed = AttemptEnd.failed("the worker gave up")
    assert step.ended(attempt, failed) is failed and ledger.checks.of_run(RUN) == []
    assert step.ended(attempt, DONE) is DONE
    assert step.released(attempt) is None  # green: no round
    [row] = ledger.checks.of_run(RUN)
    ctx = attempt.ctx
    assert row["attempt_id"] == ctx.attempt_id
    assert row["log_path"] == str(StatePaths(git_repo).check_log(RUN, "t1", ctx.attempt_id, "after"))


@pytest.mark.parametrize(("stray", "shown"), [(5, "f1 f2 f3 f4 f5"), (6, "f1 f2 f3 f4 f5 ...")])
def test_a_dirty_worktrees_check_names_five_of_its_files_unrun(
    git_repo: Path, tmp_path: Path, ledger: Ledger, stray: int, shown: str
) -> None:
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=git_repo)
    for number in range(1, stray + 1):
        (tree / f"f{number}").write_text("not committed\n")
    task = PlanTask("t1", "p", "t", isolation="isolated", check="true")
    step, attempt = check_attempt(
        git_repo, ledger, task, workspace=tree, isolation="isolated", branch="fleet/t1"
    )
    assert step.ended(attempt, DONE).reason == f"check failed: uncommitted changes: {shown}"
    [row] = ledger.checks.of_run(RUN)
    assert row["commit_sha"] == git("rev-parse", "HEAD", cwd=tree).strip()


def test_the_note_of_a_changed_check_file_is_the_results_not_the_starts(
    git_repo: Path, ledger: Ledger
) -> None:
    sha = _commit(git_repo, "test.sh", "exit 1\n")  # an earlier attempt's
    ledger.commits.record([(sha, "m", 1)], run_id=RUN, task_id="t1", attempt_id=None, branch="main")
    task = PlanTask("t1", "p", "t", check="sh test.sh", check_fails_first=True)
    step, attempt = check_attempt(git_repo, ledger, task)
    step.before_start(attempt)
    [row] = ledger.checks.of_run(RUN)
    assert row["phase"] == "before" and "[stella]" not in row["output_tail"]


def _stacked_branch(root: Path, tree: Path) -> tuple[str, str]:
    """(the run's base, a parent's commit that changes test.sh) with fleet/t1's worktree at tree on it."""
    base = git("rev-parse", "HEAD", cwd=root).strip()
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=root)
    (tree / "test.sh").write_text("exit 0\n")
    git("add", "test.sh", cwd=tree)
    git("commit", "-q", "-m", "the parent's work", cwd=tree)
    return base, git("rev-parse", "HEAD", cwd=tree).strip()


@pytest.mark.parametrize(("base", "named"), [("parents", False), ("pinned", True)])
def test_a_check_file_changed_before_the_tasks_start_is_named_only_when_that_start_is_its_own(
    git_repo: Path, tmp_path: Path, ledger: Ledger, base: str, named: bool
) -> None:
    """Stacked: its parents' commit is theirs. Pinned with a start of its own (a salvage): the task's."""
    tree = tmp_path / "wt"
    pinned, start = _stacked_branch(git_repo, tree)
    _commit(tree, "work.txt")
    task = PlanTask("t1", "p", "t", isolation="isolated", check="sh test.sh", base=base)
    on_branch = {"workspace": tree, "isolation": "isolated", "branch": "fleet/t1", "base_commit": pinned}
    step, attempt = check_attempt(git_repo, ledger, task, **on_branch)
    attempt.context = replace(attempt.ctx, start_commit=start)
    assert step.ended(attempt, DONE).reason is None
    [row] = ledger.checks.of_run(RUN)
    assert row["output_tail"].endswith("[stella] the task changed test.sh, which its check runs\n") == named
