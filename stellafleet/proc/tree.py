"""A worker process and everything it starts, treated as one tree.

The worker runs in its own session (so the terminal's Ctrl-C does not reach it and the fleet decides what
happens), its exit is polled for (reaped with wait4, for the kernel's rusage), and its CPU time and memory
are measured from psutil samples of the whole tree plus that rusage.
Stopping is always for the whole tree: SIGTERM to every known process and the process group, SIGKILL to
whatever is still there after a grace period. A process that left the tree between two samples (a double
fork while its worker was being killed: the orphan goes to init) is found by the attempt's identity in
its environment, which every descendant inherits.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stellafleet.proc import runner
from stellafleet.proc.group import signal_group, stop_group
from stellafleet.proc.runner import signal_description
from stellafleet.proc.usage import tree_of, usage_of

# in the environment of an attempt's processes: its repository, its run, its attempt (ids are per ledger)
IDENTITY_KEYS = ("STELLA_ROOT", "STELLA_RUN_ID", "STELLA_ATTEMPT_ID")
UNKNOWN_STATUS = 255  # an exit whose status nobody could read (reaped elsewhere)
POLL_S = 0.05  # how often a wait looks whether the worker has ended


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
        self._identity = dict(identity or {})
        self.pid = process.pid
        self._known: dict[int, psutil.Process] = {}
        self._peak_rss = 0
        self._cpu = 0.0
        self._exit: Exit | None = None
        try:  # our unreaped child: the pid names the worker until we reap it
            self._root: psutil.Process | None = psutil.Process(self.pid)
        except psutil.Error:
            self._root = None
        self._born = self._root.create_time() if self._root is not None else 0.0

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path) -> ProcessTree:
        """Start argv in a new session, stdin closed, stdout+stderr appended to log_path."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = runner.start(argv, cwd=cwd, env=env, stdout=log, stderr=runner.STDOUT)
        return cls(process, {key: env[key] for key in IDENTITY_KEYS if key in env})

    # --- observing ---

    def _members(self) -> list[psutil.Process]:
        members = tree_of(self._root) if self._root is not None and self._exit is None else []
        for proc in members[1:]:
            self._known.setdefault(proc.pid, proc)
        return members

    def sample(self) -> None:
        """Record the tree's current memory and CPU time (peaks are kept)."""
        cpu, rss = usage_of(self._members(), self._root)
        self._peak_rss = max(self._peak_rss, rss)
        self._cpu = max(self._cpu, cpu)

    def _finish(self, code: int, cpu: float, rss: int) -> Exit:
        self._exit = Exit(code, max(self._cpu, cpu), max(self._peak_rss, rss))
        self.process.reaped(code)
        return self._exit

    def poll(self) -> Exit | None:
        """The exit, once the worker has ended (its rusage includes the descendants it waited for)."""
        if self._exit is not None:
            return self._exit
        if self.process.returncode is not None:  # reaped by stop_group
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

    # --- stopping ---

    def signal_tree(self, sig: int) -> None:
        """Send sig to every process of the tree, including orphans seen earlier and the process group."""
        self.signal_known(sig)
        # The group id is the worker's pid, which the kernel hands to no new process while any member of
        # the group (the unreaped worker or a child it left behind) still lives.
        signal_group(self.pid, sig)

    def signal_known(self, sig: int) -> None:
        """Send sig to the worker and every descendant seen so far (those that left its group too)."""
        members = self._members()
        targets = {proc.pid: proc for proc in members}
        for pid, proc in self._known.items():
            targets.setdefault(pid, proc)
        for proc in carrying(self._identity, born=self._born):
            targets.setdefault(proc.pid, proc)
        for proc in targets.values():
            try:
                proc.send_signal(sig)  # psutil refuses a pid that was reused by another process
            except psutil.Error:
                continue

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the whole tree, up to grace_s for it to end, then SIGKILL to whatever is left."""
        self.signal_known(signal.SIGTERM)
        stop_group(self.pid, grace_s, leader=self.process if self._exit is None else None)
        self.signal_known(signal.SIGKILL)

    def end_leftovers(self) -> None:
        """After the worker ended: SIGKILL to whatever it left running (an attempt ends with its tree)."""
        self.signal_tree(signal.SIGKILL)


def carrying(identity: Mapping[str, str], *, born: float = 0.0) -> list[psutil.Process]:
    """The processes (other than this one) whose environment holds all of identity; none for an empty one.
    Processes started before born (with a second's slack) are older than the worker: never read."""
    if len(identity) < len(IDENTITY_KEYS):
        return []
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.create_time() < born - 1.0:
                continue
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue
        if all(environ.get(key) == value for key, value in identity.items()):
            found.append(proc)
    return found
