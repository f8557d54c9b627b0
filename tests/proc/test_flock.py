"""Liveness rule 1 (proc/flock.py): another live process's flock is not taken, a killed one's is at once;
a directory is locked without a lock file in it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from stellafleet.proc.flock import locked, try_lock

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from stellafleet.proc.flock import try_lock
    assert try_lock(Path(sys.argv[1])) is not None
    print("holding", flush=True)
    time.sleep(120)
""")


def test_a_live_owners_lock_is_not_taken_and_a_killed_ones_is_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "owner.lock"
    owner = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "holding"
        assert try_lock(lock) is None  # its owner is alive
        owner.kill()
        owner.wait()
        fd = try_lock(lock)  # the kernel dropped the lock with its owner
        assert fd is not None
        assert try_lock(lock) is None  # held through fd: another open of it is another owner
        os.close(fd)
        again = try_lock(lock)
        assert again is not None
        os.close(again)
    finally:
        owner.kill()
        owner.wait()


def test_a_directory_is_locked_without_a_file_in_it(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    with locked(directory):
        assert try_lock(directory) is None
        assert list(directory.iterdir()) == []
    fd = try_lock(directory)
    assert fd is not None
    os.close(fd)
