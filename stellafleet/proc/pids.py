"""Is pid P, started at T, still running (where no lock can be held)? One created after T is another program.
Errs towards "alive": a wrong "alive" keeps a claim a little longer, a wrong "dead" hands out work in use."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

START_TIME_TOLERANCE_S = 1.0  # psutil's own reading: clock-tick rounding
LEDGER_SPAWN_GRACE_S = 300.0  # a ledger row's wall time, written before the spawn on a busy machine


def process_start_time(pid: int) -> float | None:
    """psutil's start time of pid in epoch seconds, None if there is no pid."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def pid_alive_since(pid: int | None, started_at_s: float | None, *, tolerance_s: float) -> bool:
    """True when pid is running (not a zombie) and was created no later than started_at_s + tolerance_s
    (started_at_s None: any process holding pid)."""
    if not pid or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return started_at_s is None or created <= started_at_s + tolerance_s


def pid_alive(pid: int | None, started_at_ms: int | None) -> bool:
    """True when pid could still be the process a ledger row recorded at started_at_ms (epoch ms)."""
    started_at_s = None if started_at_ms is None else started_at_ms / 1000
    return pid_alive_since(pid, started_at_s, tolerance_s=LEDGER_SPAWN_GRACE_S)


def descends_from(pid: int) -> bool:
    """True when this process is pid or was started (directly or not) by it."""
    try:
        me = psutil.Process()
        return pid == me.pid or any(parent.pid == pid for parent in me.parents())
    except psutil.Error:
        return False


def in_pid_namespace_since(since_ms: int) -> bool:
    """True when this process lives in a PID namespace made at or after since_ms (epoch ms), as in an
    agent CLI's sandbox, where the processes that started it are not visible."""
    init_started = process_start_time(1)
    # psutil's start times read up to a second early (the boot time is in whole seconds)
    return init_started is not None and (init_started + START_TIME_TOLERANCE_S) * 1000 >= since_ms


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named so that a reused pid is not mistaken for it: its pid and psutil start time (s)."""

    pid: int
    started_at: float

    @classmethod
    def of(cls, pid: int | None = None) -> ProcessIdentity | None:
        """The identity of running process pid (default: this process), or None when there is none."""
        pid = os.getpid() if pid is None else pid
        started = process_start_time(pid)
        return None if started is None else cls(pid, started)

    def is_alive(self) -> bool:
        """True while this very process runs: the pid is taken by no process started after it."""
        return pid_alive_since(self.pid, self.started_at, tolerance_s=START_TIME_TOLERANCE_S)
