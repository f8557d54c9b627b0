"""What a running process tree has used so far, read from outside it (the watchdog's view of a worker)."""

from __future__ import annotations

import contextlib

import psutil


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of pid and its live descendants (with the children pid has reaped);
    None when pid is gone or cannot be read."""
    try:
        root = psutil.Process(pid)
        members = [root]
        with contextlib.suppress(psutil.Error):
            members.extend(root.children(recursive=True))
    except psutil.Error:
        return None
    total = 0.0
    for proc in members:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
        if proc is root:
            total += times.children_user + times.children_system
    return total
