"""A worker must not outlive the fleet that started it: once orphaned, it kills all it started and itself.

A killed fleet so leaves no worker writing files and committing unnoticed; its run is finalised later.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from stellafleet.proc.group import signal_group
from stellafleet.proc.subreaper import end_descendants

ORPHAN_POLL_S = 0.25


def _watch(parent: int, interval: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval)
    # Orphaned: the fleet is gone. Everything this worker started goes with it (also what left its group).
    end_descendants(0.0)
    if os.getpgrp() == os.getpid():
        signal_group(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def end_when_orphaned(interval: float = ORPHAN_POLL_S) -> threading.Thread | None:
    """Start a daemon thread that kills this process and its group once its parent is gone."""
    parent = os.getppid()
    if parent == 1:
        return None  # started by init (or already orphaned): nothing to watch
    thread = threading.Thread(target=_watch, args=(parent, interval), name="stella-orphan", daemon=True)
    thread.start()
    return thread
