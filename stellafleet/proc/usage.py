"""What a running process tree has used so far, read with psutil (proc/tree.py, run/watchdog.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil

# Linux lists each thread's children: a tree is read without psutil's scan of every process on the machine
_KERNEL_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def tree_of(root: psutil.Process) -> list[psutil.Process]:
    """root and its live descendants (root alone when they cannot be read)."""
    members = [root]
    with contextlib.suppress(psutil.Error):
        if not _KERNEL_CHILDREN:
            members.extend(root.children(recursive=True))
            return members
        for pid in _descendants(root.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                members.append(psutil.Process(pid))
    return members


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{parent}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{parent}/task/{tid}/children") as listing:
                    children = [int(child) for child in listing.read().split()]
                    found += children
                    parents += children
    return found


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
