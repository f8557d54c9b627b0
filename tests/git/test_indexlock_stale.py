"""git/indexlock.py's rule for a lock it finds: only a dead stella's index.lock is stale; a live stella's,
and git's own, are never taken (a reused pid does not make a dead holder live)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stellafleet.git import indexlock
from stellafleet.proc.pids import ProcessIdentity


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def lock_of(tmp_path: Path, text: str) -> tuple[Path, Path]:
    index = tmp_path / "index"
    index.write_text("")
    lock = tmp_path / "index.lock"
    lock.write_text(text)
    return index, lock


def test_a_live_stellas_lock_is_never_stale(tmp_path: Path) -> None:
    me = ProcessIdentity.of()
    assert me is not None
    index, lock = lock_of(tmp_path, f"{indexlock.MARKER} {me.pid} {me.started_at!r}\n")
    assert indexlock.stale_marker(lock) is None
    assert indexlock.remove_dead_leftovers(index) == [] and lock.exists()


@pytest.mark.parametrize("holder", ["dead", "reused"])
def test_a_dead_stellas_lock_is_stale_even_when_its_pid_was_reused(tmp_path: Path, holder: str) -> None:
    me = ProcessIdentity.of()
    assert me is not None
    pid, started = (dead_pid(), me.started_at) if holder == "dead" else (me.pid, me.started_at - 3600.0)
    index, lock = lock_of(tmp_path, f"{indexlock.MARKER} {pid} {started!r}\n")
    assert indexlock.stale_marker(lock) == pid
    assert indexlock.remove_dead_leftovers(index) == [lock] and not lock.exists()


@pytest.mark.parametrize(
    "text", ["", "not stella's\n", f"{indexlock.MARKER} 12 x\n", f"{indexlock.MARKER} 12\n"]
)
def test_gits_own_lock_or_one_it_cannot_read_is_left_alone(tmp_path: Path, text: str) -> None:
    index, lock = lock_of(tmp_path, text)
    assert indexlock.stale_marker(lock) is None
    assert indexlock.remove_dead_leftovers(index) == [] and lock.exists()


def test_aside_files_name_their_maker_and_only_a_dead_or_reused_makers_go(tmp_path: Path) -> None:
    me = ProcessIdentity.of()
    assert me is not None
    index, _ = lock_of(tmp_path, "git's own\n")
    ms = round(me.started_at * 1000)
    mine = [tmp_path / f"index.stella-new1-{me.pid}-{ms}", tmp_path / f"index.stella-new1-{me.pid}-{ms}.lock"]
    gone = [
        tmp_path / f"index.stella-new2-{dead_pid()}-{ms}",  # its maker has ended
        tmp_path / f"index.stella-new3-{me.pid}-{ms - 3_600_000}",  # its maker's pid is another's now
        tmp_path / f"index.stella-new4-{me.pid}",  # an older stella's, named by its pid alone
        tmp_path / "index.stella-installed",  # an older stella's note
    ]
    for path in mine + gone:
        path.write_text("")
    assert sorted(indexlock.remove_dead_leftovers(index)) == sorted(gone)
    assert all(path.exists() for path in mine)
