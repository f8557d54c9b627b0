"""Many real processes at once (started with `spawn`, released together at a barrier, one report each), and
waiting for one to end."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import psutil

SPAWN = mp.get_context("spawn")


def run_together(
    target: Callable[..., None], args: Callable[[int], tuple[Any, ...]], count: int, *, timeout: float = 120.0
) -> list[Any]:
    """Run target(*args(n), barrier, out) in count spawned processes; each waits at barrier before its work
    and puts one report on out. Returns the reports in arrival order; fails when a process exits non-zero."""
    barrier = SPAWN.Barrier(count)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args(n), barrier, out)) for n in range(count)]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=timeout) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"process {proc.pid} ended with exit code {proc.exitcode}"
    return reports


def ended_within(pid: int, seconds: float) -> bool:
    """Whether pid ends (or is a zombie) within seconds: a signal is sent at once, the kernel may take a
    moment to end the process."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False
