"""`stella commit`'s scratch directories in the system temp folder, and their removal once their process
is gone.

A commit stages into a private index in a directory of its own (`stella-commit-*`, `stella-index-*`).
A `stella commit` killed with SIGKILL (or SIGTERM, which ends Python without unwinding) never removes it,
and a fleet whose workers time out or are stopped leaves one per stopped commit, each a copy of the
repository's index. The commit holds an flock on the directory's `.owner` file while it lives; any later
stella command removes the directories whose lock it can take. The kernel lets go of the lock when the
process dies, whatever pid namespace it ran in (an agent CLI's sandbox may have its own, sharing this
temp folder), so a live commit's directory is never taken for a dead one; one without `.owner` (being
made, or made by an older stella) is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIXES = ("stella-commit-", "stella-index-")
OWNER = ".owner"


@contextlib.contextmanager
def directory(prefix: str) -> Iterator[str]:
    """A temporary directory named prefix... (one of PREFIXES), owned by this process while it is open."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        # locked before it takes its name: a sweep never finds an `.owner` it could lock
        unnamed = Path(tmp) / f"{OWNER}.new"
        owner = os.open(unnamed, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(owner, fcntl.LOCK_EX)
            os.replace(unnamed, Path(tmp) / OWNER)
            yield tmp
        finally:
            os.close(owner)


def _abandoned(entry: Path) -> bool:
    """True when entry's owner lock can be taken: the process that made it is gone."""
    try:
        owner = os.open(entry / OWNER, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(owner)  # the lock goes with it; the directory is removed next
    return True


def sweep_dead(where: Path | None = None) -> list[Path]:
    """Remove the scratch directories whose process no longer runs; returns them."""
    removed: list[Path] = []
    base = Path(where or tempfile.gettempdir())
    for entry in (found for prefix in PREFIXES for found in base.glob(f"{prefix}*")):
        if entry.is_dir() and _abandoned(entry):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry)
                removed.append(entry)
    return removed
