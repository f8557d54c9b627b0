"""merge/journal.py's repair of a killed `stella merge --resolve`, called in process on the record it
leaves: the resolve task's live worker stopped (never a process that reused its pid), its uncommitted
work salvaged before its worktree goes, its attempt abandoned, its task interrupted, its branch deleted
only when it has nothing beyond the tip. (The whole kill, through real processes, is
tests/merge/test_merge_resolve_killed.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, worktrees
from stellafleet.merge import journal as merge_journal
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN = "r-20261201-130000-dddd"
TASK = "resolve-1"


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """The resolve task's worker: a process leading a session of its own, as a worker does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def killed_resolve(root: Path, pid: int | None, *, started_ms: int | None = None) -> tuple[Path, str]:
    """A resolve task running in its worktree on fleet/resolve-1 at the tip, as a killed --resolve left it."""
    tip = gitops.head_commit(root)
    path = StatePaths(root).worktrees / TASK
    worktrees.worktree_add(root, path, f"fleet/{TASK}", tip)
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN, root=str(root), base_commit=tip)
        ledger.tasks.add(RUN, [sample_task(TASK, isolation="isolated")], {TASK: 1})
        ledger.tasks.set_status(RUN, TASK, "running")
        attempt = ledger.attempts.start(
            RUN, TASK, pipeline="command", branch=f"fleet/{TASK}", worktree=str(path)
        )
        if pid is not None:
            ledger.attempts.set_pid(attempt, pid)
        if started_ms is not None:
            with ledger._db.write() as conn:  # a start time the ledger API never rewrites: set by hand
                conn.execute("UPDATE attempts SET pid_started_ms = ? WHERE id = ?", (started_ms, attempt))
    return path, tip


def repair(root: Path, tip: str) -> bool:
    data = {"kind": "merge", "pid": 999_999_992, "resolving": {"run_id": RUN, "task_id": TASK, "tip": tip}}
    return merge_journal.repair(root, [journal.Record(root / "record.json", data)])


def run_state(root: Path) -> tuple[str, str, str | None]:
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        detail = ledger.get_run(RUN)
    (attempt,) = detail["attempts"]
    (task,) = detail["tasks"]
    return task["status"], attempt["outcome"], attempt.get("salvage_ref")


def test_a_killed_resolve_has_its_worker_stopped_and_its_work_salvaged_before_the_worktree_goes(
    git_repo: Path, worker: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    path, tip = killed_resolve(git_repo, worker.pid)
    (path / "half.txt").write_text("half resolved\n")
    assert repair(git_repo, tip)
    assert worker.wait(timeout=30) != 0
    status, outcome, ref = run_state(git_repo)
    assert (status, outcome) == ("interrupted", "abandoned")
    assert ref == f"refs/stella/salvage/{RUN}/{TASK}/1"
    assert git("show", f"{ref}:half.txt", cwd=git_repo) == "half resolved\n"
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        detail = ledger.get_run(RUN)
    why = merge_journal.RESOLVE_REASON
    assert (detail["tasks"][0]["reason"], detail["attempts"][0]["summary"]) == (why, why)
    assert detail["attempts"][0]["error"] == why
    assert not path.exists() and not gitops.branch_exists(git_repo, f"fleet/{TASK}")
    said = (
        f"stella: a killed stella merge (pid 999999992) was finished: its resolve task {TASK}: its worker "
        f"(pid {worker.pid}) stopped, its uncommitted work salvaged as {ref}, recorded interrupted, "
        f"its worktree removed, its empty branch fleet/{TASK} deleted\n"
    )
    assert capsys.readouterr().err == said


def test_a_process_that_reused_the_workers_pid_is_never_signalled(
    git_repo: Path, worker: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """The recorded worker started an hour before the process that has its pid now."""
    path, tip = killed_resolve(git_repo, worker.pid, started_ms=int((time.time() - 3600) * 1000))
    git("commit", "-q", "--allow-empty", "-m", "resolved part", cwd=path)  # the branch is past the tip
    assert repair(git_repo, tip)
    assert worker.poll() is None
    assert run_state(git_repo)[:2] == ("interrupted", "abandoned")
    assert not path.exists() and gitops.branch_exists(git_repo, f"fleet/{TASK}")  # its commit kept
    err = capsys.readouterr().err
    assert err.endswith(f"its resolve task {TASK}: recorded interrupted, its worktree removed\n"), err


def test_a_resolve_that_had_already_ended_is_said_so(
    git_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tip = gitops.head_commit(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, RUN, root=str(git_repo), base_commit=tip)
    assert repair(git_repo, tip)
    assert capsys.readouterr().err.endswith(f"its resolve task {TASK}: had already ended\n")
