"""Liveness rule 1, and the one flock: a lock the kernel drops when its owner dies, so "is its owner alive"
is "can I take its lock". (Rule 2, a recorded pid plus its start time: proc/pids.py.)"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def try_lock(path: Path, *, wait: bool = False) -> int | None:
    """path's flock (a directory's: no lock file), held until the descriptor returned is closed; None while
    another process holds it (wait: until it is free). A lock file removed meanwhile is locked again."""
    while True:
        fd = os.open(path, os.O_RDONLY if path.is_dir() else os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """path's flock for the body (its directory made if need be), waiting while another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = try_lock(path, wait=True)
    assert fd is not None
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock
