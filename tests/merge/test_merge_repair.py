"""merge/journal.py's repair, called in process on the record a killed `stella merge` leaves: it removes
only an index.lock its own git left and records `merged` only when the branch is in the target; and the
repair of its check's own record (run/checking.py) signals only that check, never a process that reused
the pid. (The whole kill, through real processes, is
tests/merge/test_merge_killed.py; this is what each decision does.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.merge import journal as merge_journal
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.run import checking
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

RUN = "r-20261201-120000-cccc"


def commit(root: Path, name: str, text: str) -> str:
    (root / name).write_text(text)
    git("add", name, cwd=root)
    git("commit", "-q", "-m", f"add {name}", cwd=root)
    return git("rev-parse", "HEAD", cwd=root).strip()


class Killed:
    """A repository where a `stella merge` of fleet/t onto main was killed after moving main's ref and
    before the index and files: the journal record it left, and its planned merges row."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.old = git("rev-parse", "HEAD", cwd=root).strip()
        git("checkout", "-q", "-b", "fleet/t", cwd=root)
        self.head = commit(root, "t.txt", "task work\n")
        git("checkout", "-q", "main", cwd=root)
        self.new = self.head  # a fast-forward: the landed commit is the branch's tip
        with Ledger.open(StatePaths(root).fleet_db) as ledger:
            add_run(ledger, RUN, root=str(root), base_commit=self.old)
            self.merge_id = ledger.merges.start(
                run_id=RUN,
                task_id="t",
                branch="fleet/t",
                position=1,
                strategy="rebase",
                onto_ref="main",
                before_sha=self.old,
                check_command=None,
            )
        self.path = StatePaths(root).merge_journal

    def move_ref(self) -> None:
        git("update-ref", "refs/heads/main", self.new, self.old, cwd=self.root)

    def data(self, **fields: Any) -> dict[str, Any]:
        landing = {"onto": "main", "old": self.old, "new": self.new}
        return {"kind": "merge", "pid": 999_999_991, "merge_id": self.merge_id, "branch": "fleet/t"} | {
            "landing": landing,
            "head": self.head,
            **fields,
        }

    def repair(self, data: dict[str, Any], *, written_at: float | None = None) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data))
        if written_at is not None:
            os.utime(self.path, (written_at, written_at))
        return merge_journal.repair(self.root, [journal.Record(self.path, data)])

    def row(self) -> dict[str, Any]:
        with Ledger.open(StatePaths(self.root).fleet_db, readonly=True) as ledger:
            [row] = ledger.merges.of_run(RUN)
        return row


@pytest.fixture
def killed(git_repo: Path) -> Killed:
    return Killed(git_repo)


def test_a_landed_branch_gets_its_files_and_is_recorded_merged(
    killed: Killed, capsys: pytest.CaptureFixture[str]
) -> None:
    killed.move_ref()
    assert not (killed.root / "t.txt").exists()  # killed before the files
    assert killed.repair(killed.data())
    assert (killed.root / "t.txt").read_text() == "task work\n"
    assert git("status", "--porcelain", "--untracked-files=no", cwd=killed.root) == ""
    row = killed.row()
    assert (row["status"], row["after_sha"]) == ("merged", killed.new)
    assert row["reason"] == f"landed on main at {killed.new[:12]} (finished after stella merge was killed)"
    said = capsys.readouterr().err.strip()
    assert said == (
        "stella: a killed stella merge (pid 999999991) was finished: "
        f"main at {killed.new[:12]} got its index and files; fleet/t recorded merged"
    )


def test_a_ref_that_never_moved_is_recorded_an_error_not_merged(killed: Killed) -> None:
    assert killed.repair(killed.data())
    row = killed.row()
    assert (row["status"], row["after_sha"]) == ("error", None)
    assert row["reason"] == "stella merge was stopped before this branch landed (killed or interrupted)"
    assert git("rev-parse", "main", cwd=killed.root).strip() == killed.old


def test_merged_is_recorded_only_when_the_branch_is_in_the_target(killed: Killed) -> None:
    """main moved to a commit that does not hold the branch's head (its tip moved on after the step was
    noted, say): the files are finished, but the branch is not recorded merged."""
    git("checkout", "-q", "fleet/t", cwd=killed.root)
    later = commit(killed.root, "later.txt", "more\n")
    git("checkout", "-q", "main", cwd=killed.root)
    killed.move_ref()
    assert killed.repair(killed.data(head=later))
    assert (killed.root / "t.txt").exists()
    assert (killed.row()["status"], killed.row()["after_sha"]) == ("error", None)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a group of its own, as a merge's check does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def check_record(root: Path, who: list[float]) -> list[journal.Record]:
    """The journal record a killed merge's check leaves (its own, beside the merge's)."""
    path = root / "check-record.json"
    data = {"kind": checking.RECORD, "pid": 999_999_991, "check": who}
    path.write_text(json.dumps(data))
    return [journal.Record(path, data)]


def test_the_repair_stops_its_own_check(git_repo: Path, sleeper: subprocess.Popen[bytes]) -> None:
    who = ProcessIdentity.of(sleeper.pid)
    assert who is not None
    assert checking.repair(git_repo, check_record(git_repo, [who.pid, who.started_at]))
    assert sleeper.wait(timeout=30) != 0


def test_the_repair_never_signals_a_process_that_reused_the_checks_pid(
    git_repo: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    who = ProcessIdentity.of(sleeper.pid)
    assert who is not None
    # the check's pid, now a process started a minute after the recorded check
    assert checking.repair(git_repo, check_record(git_repo, [who.pid, who.started_at - 60.0]))
    assert sleeper.poll() is None
    assert "its check" not in capsys.readouterr().err


def lock_made_at(root: Path, when: float) -> Path:
    lock = root / ".git" / "index.lock"
    lock.write_text("")
    os.utime(lock, (when, when))
    return lock


@pytest.mark.parametrize(
    ("lock_age", "removed"),
    [
        (-merge_journal.LOCK_CLOCK_SLACK_S, True),  # exactly the slack older than the record: its git's
        (-merge_journal.LOCK_CLOCK_SLACK_S - 0.5, False),  # older still: another git's, maybe live
        (0.0, True),
    ],
    ids=["at-the-slack", "older", "same-time"],
)
def test_an_index_lock_is_removed_only_when_younger_than_the_killed_step(
    killed: Killed, capsys: pytest.CaptureFixture[str], lock_age: float, removed: bool
) -> None:
    killed.move_ref()
    written = 1_900_000_000.0
    lock = lock_made_at(killed.root, written + lock_age)
    finished = killed.repair(killed.data(), written_at=written)
    said = capsys.readouterr().err
    assert finished is removed and lock.exists() is not removed
    if removed:
        assert "removed the .git/index.lock its killed git left" in said
        assert killed.row()["status"] == "merged"
    else:
        assert said.strip() == (
            "stella: a killed stella merge (pid 999999991) is not finished yet: .git/index.lock is older "
            "than the killed merge's last step, so it may be another git's: if no git command is running "
            "in this repository, remove it and run any stella command again "
            f"(its journal stays at {killed.path})"
        )
        assert killed.row()["status"] == "planned"


def test_an_index_lock_with_no_record_time_is_left(killed: Killed) -> None:
    killed.move_ref()
    lock = lock_made_at(killed.root, 1_900_000_000.0)
    record = journal.Record(killed.root / "no-such-record.json", killed.data())
    assert not merge_journal.repair(killed.root, [record])
    assert lock.exists()


def test_a_git_running_in_the_repository_keeps_the_lock(killed: Killed) -> None:
    killed.move_ref()
    other = subprocess.Popen(
        ["git", "hash-object", "--stdin"], cwd=killed.root, stdin=subprocess.PIPE, text=True
    )
    try:
        who = ProcessIdentity.of(other.pid)
        assert who is not None
        lock = lock_made_at(killed.root, who.started_at + 1.0)  # made after that git started
        assert not killed.repair(killed.data(), written_at=who.started_at + 1.0)
        assert lock.exists()
    finally:
        other.communicate("x", timeout=30)
    assert killed.repair(killed.data(), written_at=who.started_at + 1.0)  # it ended: the lock was its own
    assert not lock.exists() and killed.row()["status"] == "merged"


def test_a_record_with_nothing_noted_has_nothing_to_do(
    killed: Killed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert killed.repair({"kind": "merge", "pid": 7})
    assert capsys.readouterr().err.strip() == (
        "stella: a killed stella merge (pid 7) was finished: nothing was left to do"
    )
    assert killed.row()["status"] == "planned"


def test_the_scratch_directory_and_check_worktree_go(killed: Killed, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    (scratch / "deep").mkdir(parents=True)
    check = tmp_path / "check-tree"
    git("worktree", "add", "-q", "--detach", str(check), "HEAD", cwd=killed.root)
    assert killed.repair(killed.data(landing=None, scratch=str(scratch), worktree=str(check)))
    assert not scratch.exists() and not check.exists()
    assert str(check) not in git("worktree", "list", cwd=killed.root)
