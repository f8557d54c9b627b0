"""The guard: a direct command must not outlive a killed fleet either.

A worker process watches its own parent and ends its process group once orphaned (orphan.py). A direct
command (`[pipelines.command] direct`, run/direct.py) is a plain shell the fleet starts itself, with no
such watch. So a run with direct commands starts one small guard process, and the fleet tells it each
command's process group as the command starts and ends. The guard reads a pipe that only the fleet
writes to: however the fleet dies (SIGKILL included), the guard reads end-of-file, kills every group
still listed, and leaves. A fleet that finishes normally says `bye` first, and the guard just leaves.

    -> "+PGID\\n" a group to guard, "-PGID\\n" a group that ended, "bye\\n" the fleet is done

The guard imports almost nothing, so it starts quickly; it runs in its own session, so the terminal's
Ctrl-C stays the fleet's to handle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

from stellafleet.proc.group import signal_group
from stellafleet.proc.pids import START_TIME_TOLERANCE_S, ProcessIdentity


def _still_that_group(pgid: int, leader: ProcessIdentity | None) -> bool:
    """Whether group pgid is still the one the fleet named: its leader is still there (running, or a zombie
    not yet reaped), or has ended (a group outlives its leader while a member lives, and its number is not
    reused meanwhile); not when a process started since holds the leader's pid (the group ended and its
    number went to a new process)."""
    holder = ProcessIdentity.of(pgid)
    if leader is None or holder is None:
        return True
    return abs(holder.started_at - leader.started_at) <= START_TIME_TOLERANCE_S


def serve(stdin: int) -> int:
    """The guard's loop: track the groups the fleet names; on end-of-file without `bye`, kill them all."""
    groups: dict[int, ProcessIdentity | None] = {}
    buffer = b""
    while True:
        try:
            chunk = os.read(stdin, 65536)
        except InterruptedError:
            continue
        if not chunk:  # the fleet is gone without saying bye: it was killed
            for pgid, leader in groups.items():
                if _still_that_group(pgid, leader):
                    signal_group(pgid, signal.SIGKILL)
            return 0
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line == b"bye":
                return 0
            if line[:1] == b"+":
                pgid = int(line[1:])
                groups[pgid] = ProcessIdentity.of(pgid)
            elif line[:1] == b"-":
                groups.pop(int(line[1:]), None)


class Guard:
    """The fleet's side: `watch` and `forget` are safe from many threads, and never block on the guard."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        self._proc = proc
        self._fd = proc.stdin.fileno()
        self._lock = threading.Lock()
        self.alive = True

    @classmethod
    def start(cls) -> Guard | None:
        """A running guard, or None when none can be started."""
        try:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "stellafleet.proc.guard"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            return None
        return cls(proc)

    def _send(self, line: str) -> bool:
        with self._lock:
            if not self.alive:
                return False
            try:
                os.write(self._fd, line.encode())  # one short line: a single atomic pipe write
            except OSError:  # the guard is gone (someone killed it): nothing guards from now on
                self.alive = False
        return self.alive

    def watch(self, pgid: int) -> bool:
        """Kill group pgid if the fleet dies; False when the guard is gone and cannot."""
        return self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """Group pgid has ended (its leader was reaped): the number may name another group one day."""
        self._send(f"-{pgid}\n")

    def close(self) -> None:
        """The fleet is done: the guard leaves without killing anything. Nobody waits for that here (a
        guard still starting up would hold up the fleet's own exit): a thread reaps it."""
        self._send("bye\n")
        with self._lock:
            self.alive = False
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        threading.Thread(target=self._proc.wait, name="stella-guard-reaper", daemon=True).start()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # in its own session anyway; never ends on a stray Ctrl-C
    sys.exit(serve(sys.stdin.fileno()))
