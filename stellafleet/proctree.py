"""A worker process and everything it starts, treated as one tree.

The worker runs in its own session (so the terminal's Ctrl-C does not reach it and the fleet decides what
happens), its exit is awaited through a pidfd when the platform has one (no polling latency), and its CPU
time and memory are measured from psutil samples of the whole tree plus the kernel's rusage at reaping.
Stopping is always for the whole tree: SIGTERM to every known process and the process group, SIGKILL to
whatever is still there after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


def signal_description(returncode: int) -> str:
    """'exit status 3' or 'killed by signal SIGKILL' for a Popen-style return code."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by signal {name}"


@dataclass(frozen=True)
class Exit:
    returncode: int  # negative: killed by that signal (the subprocess convention)
    cpu_seconds: float
    peak_rss_bytes: int

    @property
    def signalled(self) -> bool:
        return self.returncode < 0

    def describe(self) -> str:
        return signal_description(self.returncode)


class ProcessTree:
    """One started worker; not thread-safe (one dispatch thread owns it)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._root: psutil.Process | None
        try:
            self._root = psutil.Process(self.pid)
        except psutil.Error:
            self._root = None
        self._known: dict[int, psutil.Process] = {}
        self._peak_rss = 0
        self._cpu = 0.0
        self._exit: Exit | None = None
        self._pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:
                self._pidfd = None

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path) -> ProcessTree:
        """Start argv in a new session with stdin closed and stdout+stderr appended to log_path."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                list(argv),
                cwd=str(cwd),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        return cls(popen)

    # --- observing ---

    def _members(self) -> list[psutil.Process]:
        members: list[psutil.Process] = []
        if self._root is not None and self._exit is None:
            members.append(self._root)
            with contextlib.suppress(psutil.Error):
                members.extend(self._root.children(recursive=True))
        for proc in members[1:]:
            self._known.setdefault(proc.pid, proc)
        return members

    def sample(self) -> None:
        """Record the tree's current memory and CPU time (peaks are kept)."""
        rss = 0
        cpu = 0.0
        for proc in self._members():
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    if proc is self._root:  # children it already reaped
                        cpu += times.children_user + times.children_system
            except psutil.Error:
                continue
        self._peak_rss = max(self._peak_rss, rss)
        self._cpu = max(self._cpu, cpu)

    def poll(self) -> Exit | None:
        """Reap the worker if it has exited (its rusage includes the descendants it waited for)."""
        if self._exit is not None:
            return self._exit
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere; nothing more to learn
            pid, status, usage = self.pid, 0, None
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        cpu, rss = self._cpu, self._peak_rss
        if usage is not None:
            cpu = max(cpu, usage.ru_utime + usage.ru_stime)
            rss = max(rss, usage.ru_maxrss * 1024)  # KiB on Linux
        self._exit = Exit(code, cpu, rss)
        self.popen.returncode = code  # so Popen never waits on a pid we already reaped
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self._exit

    def wait(self, timeout: float, *, wake_fd: int | None = None) -> Exit | None:
        """Wait up to timeout for the exit (or until wake_fd becomes readable); the exit or None."""
        done = self.poll()
        if done is not None or timeout <= 0:
            return done
        if self._pidfd is not None:
            fds = [self._pidfd] + ([wake_fd] if wake_fd is not None else [])
            with contextlib.suppress(InterruptedError):
                select.select(fds, [], [], timeout)
            return self.poll()
        deadline = time.monotonic() + timeout
        delay = 0.001
        while time.monotonic() < deadline:
            if wake_fd is not None and select.select([wake_fd], [], [], 0)[0]:
                break
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 0.05)
            done = self.poll()
            if done is not None:
                return done
        return self.poll()

    # --- stopping ---

    def signal_tree(self, sig: int) -> None:
        """Send sig to every process of the tree, including orphans seen earlier and the process group."""
        members = self._members()
        targets = {proc.pid: proc for proc in members}
        for pid, proc in self._known.items():
            targets.setdefault(pid, proc)
        for proc in targets.values():
            try:
                proc.send_signal(sig)  # psutil refuses a pid that was reused by another process
            except psutil.Error:
                continue
        if self._exit is None:
            # While the unreaped root holds its pid, the group id cannot belong to anyone else.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
