"""The Check step's decisions in process (run/steps/check.py), on real repositories and real checks: the
prompt it adds to, the commit it checks, a run stopped mid-check, the rounds it gives, check_fails_first
in a task's own worktree, a check tree whose setup fails (issue 49 item 18's survivors)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.fleet import RUN, check_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome, FollowUpReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptFailed
from stellafleet.run.steps.check import VACUOUS, runs_changed, told
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")


def _commit(root: Path, name: str) -> str:
    (root / name).write_text(f"{name}\n")
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
        assert step.ended(attempt, DONE).reason == "check failed (exit 1): FAIL parser"
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
    assert row["phase"] == "before" and row["commit_sha"] == git("rev-parse", "HEAD", cwd=tree).strip()


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
