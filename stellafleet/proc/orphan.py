"""Processes that must not outlive the fleet that started them.

The warm launcher asks the kernel to kill it the moment the fleet dies (a parent-death signal), and
every worker watches its own parent: when the worker is orphaned (its parent, the launcher or the fleet,
is gone), it kills its whole process group, itself included. A killed fleet so leaves no worker running
on unnoticed, still writing files and committing; its run is finalised later (state/ledger_recovery.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from stellafleet.proc.group import signal_group

PR_SET_PDEATHSIG = 1
ORPHAN_POLL_S = 0.25


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send sig to this process when its parent dies (Linux); False where it cannot.

    Call it from the process's main thread right after start: the parent may already be gone, which is
    checked after the request."""
    if sys.platform != "linux":
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), sig)  # the parent died before the request took effect
    return True


def _watch(parent: int, interval: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval)
    # Orphaned: the fleet is gone. Everything this worker started goes with it.
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
