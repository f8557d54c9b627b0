"""What a running process tree has used so far, read with psutil: for the worker's tree (proc/tree.py)
and the watchdog (run/watchdog.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil


def tree_of(root: psutil.Process) -> list[psutil.Process]:
    """root and its live descendants (root alone when they cannot be read)."""
    members = [root]
    with contextlib.suppress(psutil.Error):
        members.extend(root.children(recursive=True))
    return members


def usage_of(members: Iterable[psutil.Process], root: psutil.Process | None) -> tuple[float, int]:
    """(user + system CPU seconds, resident bytes) of members, with the children root has reaped; a
    member that is gone or cannot be read counts nothing."""
    cpu, rss = 0.0, 0
    for proc in members:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                rss += proc.memory_info().rss
        except psutil.Error:
            continue
        cpu += times.user + times.system
        if proc is root:
            cpu += times.children_user + times.children_system
    return cpu, rss


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of pid's tree (usage_of); None when pid is gone or cannot be read."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return None
    return usage_of(tree_of(root), root)[0]
