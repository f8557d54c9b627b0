"""A worker process and everything it starts, treated as one tree, and what a tree has used so far.
Its own session leaves the terminal's Ctrl-C to the fleet; wait4 gives the kernel's rusage."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stellafleet.proc import runner
from stellafleet.proc.group import ProcessSet
from stellafleet.proc.runner import signal_description

UNKNOWN_STATUS = 255  # an exit whose status nobody could read (reaped elsewhere)
POLL_S = 0.05  # how often a wait looks whether the worker has ended
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


@dataclass(frozen=True)
class Exit:
    returncode: int  # negative: killed by that signal (the subprocess convention)
    cpu_seconds: float
    peak_rss_bytes: int

    def describe(self) -> str:
        return signal_description(self.returncode)


class ProcessTree:
    """One started worker, our own child; not thread-safe (one dispatch thread owns it)."""

    def __init__(self, process: runner.Process, identity: Mapping[str, str] | None = None) -> None:
        self.process = process
        self.pid = process.pid
        # the kernel gives the group id to no new process while any member of the group lives
        self.members = ProcessSet(self.pid, group=self.pid, leader=process, identity=identity)
        self._peak_rss = 0
        self._cpu = 0.0
        self._exit: Exit | None = None
        # our unreaped child: the pid names the worker until we reap it
        self._root: psutil.Process | None = self.members.known.get(self.pid)
        with contextlib.suppress(psutil.Error):
            self.members.born = self._root.create_time() if self._root is not None else 0.0

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path) -> ProcessTree:
        """Start argv in a new session, stdin closed, stdout+stderr appended to log_path."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = runner.start(argv, cwd=cwd, env=env, stdout=log, stderr=runner.STDOUT)
        return cls(process, env)

    def _members(self) -> list[psutil.Process]:
        members = tree_of(self._root) if self._root is not None and self._exit is None else []
        self.members.add(members)
        return members

    def sample(self) -> None:
        """Record the tree's current memory and CPU time (peaks are kept)."""
        cpu, rss = usage_of(self._members(), self._root)
        self._peak_rss = max(self._peak_rss, rss)
        self._cpu = max(self._cpu, cpu)

    def _finish(self, code: int, cpu: float, rss: int) -> Exit:
        self._exit = Exit(code, max(self._cpu, cpu), max(self._peak_rss, rss))
        self.process.reaped(code)
        self.members.leader = None  # a stop now waits for what is left of its group, not for the worker
        return self._exit

    def poll(self) -> Exit | None:
        """The exit, once the worker has ended (its rusage includes the descendants it waited for)."""
        if self._exit is not None:
            return self._exit
        if self.process.returncode is not None:  # reaped by a stop
            return self._finish(self.process.returncode, self._cpu, self._peak_rss)
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere; nothing more to learn
            return self._finish(UNKNOWN_STATUS, self._cpu, self._peak_rss)
        if pid == 0:
            return None
        # ru_maxrss is in KiB on Linux
        return self._finish(
            os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024
        )

    def wait(self, timeout: float) -> Exit | None:
        """Wait up to timeout for the exit; the exit or None."""
        deadline = time.monotonic() + timeout
        while (done := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
        return done

    def signal_tree(self, sig: int) -> None:
        """Send sig to the worker's whole set: its group, every descendant seen, its identity's carriers."""
        self.members.signal(sig)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the whole set, up to grace_s for it to end, then SIGKILL to whatever is left."""
        self.members.stop(grace_s)
