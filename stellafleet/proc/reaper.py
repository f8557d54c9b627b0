"""`python -m stellafleet.proc.reaper WATCHED ROOT GRACE`: end ROOT's process tree once WATCHED is gone.

A worker started on a remote node belongs to the process that runs its attempt there. That process can
die without a word (a forced cancel, a lost node): its worker, started in a session of its own, would live
on, spending, with nobody to stop it. This sidecar watches that process (by identity, so a reused pid
does not fool it) and learns the worker's tree as it grows; once the watched process is gone it stops
every member it has seen (SIGTERM, GRACE seconds, SIGKILL), as the fleet does at home. It ends by itself
once the whole tree has. It detaches from WATCHED (double fork, a session of its own): Ray kills a dying
worker's children, and this sidecar must outlive exactly that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import psutil

from stellafleet.proc.pids import ProcessIdentity

POLL_S = 0.2


def check_root(root: int) -> None:
    """Refuse a root whose tree would hold this process or the whole system (pid 1, an ancestor)."""
    ancestors = {proc.pid for proc in psutil.Process().parents()}
    if root <= 1 or root == os.getpid() or root in ancestors:
        raise ValueError(f"refusing to watch the tree of pid {root}: it is this process, init or an ancestor")


class Members:
    """The processes of one tree as seen so far: psutil handles, which refuse a pid reused since."""

    def __init__(self, root: int) -> None:
        self.known: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            self.known[root] = psutil.Process(root)

    def learn(self) -> None:
        for proc in list(self.known.values()):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    self.known.setdefault(child.pid, child)

    def alive(self) -> list[psutil.Process]:
        found = []
        for proc in self.known.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        return found

    def signal(self, sig: int) -> None:
        for proc in self.alive():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)


def reap(watched: int, root: int, grace_s: float, *, poll_s: float = POLL_S) -> bool:
    """Wait while watched runs, then stop root's tree; False when the tree ended by itself first."""
    check_root(root)
    identity = ProcessIdentity.of(watched)  # None: it is gone already
    members = Members(root)
    while identity is not None and identity.is_alive():
        members.learn()  # now: once orphaned, members are no longer root's descendants
        if not members.alive():
            return False
        time.sleep(poll_s)
    members.learn()
    members.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while members.alive() and time.monotonic() < deadline:
        time.sleep(min(poll_s, grace_s))
    members.signal(signal.SIGKILL)
    return True


def detach() -> None:
    """Go on in a grandchild in a session of its own (printing its pid); the caller's child exits now.
    Past this point the reaper says nothing: its output goes nowhere."""
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the caller waits for its pipes to close: hold none of them
        os.dup2(devnull, fd)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--detach":
        argv = argv[1:]
        detach()
    watched, root, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    try:
        reap(watched, root, grace_s)
    except ValueError as exc:
        print(f"stella reaper: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
