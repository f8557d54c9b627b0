"""Liveness rule 2, for a recorded process where no lock can be held: its pid plus a moment it is known to
have run (its start time, or later). A pid is reused only after its process ended, so a process created
after that moment is another program. Errs towards "alive": a wrong "alive" keeps a claim a little longer,
a wrong "dead" hands out work in use. (Rule 1, a lock the kernel drops when its owner dies: proc/flock.py.)"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

START_TIME_TOLERANCE_S = 1.0  # psutil's start times read up to 1 s early (its boot time is whole seconds)


def process_start_time(pid: int) -> float | None:
    """psutil's start time of pid in epoch seconds, None if there is no pid."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def started_after(created_s: float, moment_s: float) -> bool:
    """Whether a process psutil says was created at created_s surely started after moment_s: every start-time
    comparison takes this one tolerance."""
    return created_s > moment_s + START_TIME_TOLERANCE_S


def pid_alive(pid: int | None, known_at_ms: int | None) -> bool:
    """A ledger row's process: pid, running at known_at_ms (epoch ms; None: any process holding pid)."""
    known_at_s = float("inf") if known_at_ms is None else known_at_ms / 1000
    return pid is not None and ProcessIdentity(pid, known_at_s).is_alive()


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
    return init_started is not None and not started_after(since_ms / 1000, init_started)


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named so that a reused pid is not mistaken for it: its pid and a moment it ran (epoch s),
    its psutil start time when taken with of()."""

    pid: int
    started_at: float

    @classmethod
    def of(cls, pid: int | None = None) -> ProcessIdentity | None:
        """The identity of running process pid (default: this process), or None when there is none."""
        pid = os.getpid() if pid is None else pid
        started = process_start_time(pid)
        return None if started is None else cls(pid, started)

    def is_alive(self) -> bool:
        """Rule 2: pid is held by a running process (not a zombie) created no later than started_at."""
        if self.pid <= 0:
            return False
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            created = proc.create_time()
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True
        return not started_after(created, self.started_at)
