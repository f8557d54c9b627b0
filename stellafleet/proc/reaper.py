"""`python -m stellafleet.proc.reaper WATCHED ROOT GRACE`: end ROOT's process tree once WATCHED is gone.

A worker started on a remote node belongs to the process that runs its attempt there. That process can
die without a word (a forced cancel, a lost node): its worker, started in a session of its own, would live
on, spending, with nobody to stop it. This sidecar watches that process (by identity, so a reused pid
does not fool it) and learns the worker's tree as it grows; once the watched process is gone it stops
every member it has seen (SIGTERM, GRACE seconds, SIGKILL), as the fleet does at home. The process that
started it kills it once the worker has ended normally.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from stellafleet.proc.pids import ProcessIdentity
from stellafleet.proc.tree import ProcessTree

POLL_S = 0.2


def check_root(root: int) -> None:
    """Refuse a root whose tree would hold this process or the whole system (pid 1, an ancestor)."""
    ancestors = {proc.pid for proc in psutil.Process().parents()}
    if root <= 1 or root == os.getpid() or root in ancestors:
        raise ValueError(f"refusing to watch the tree of pid {root}: it is this process, init or an ancestor")


def reap(watched: int, root: int, grace_s: float, *, poll_s: float = POLL_S) -> bool:
    """Wait while watched runs, then stop root's tree; False when watched was not running to begin with."""
    check_root(root)
    identity = ProcessIdentity.of(watched)
    if identity is None:
        return False
    tree = ProcessTree(root)
    try:
        while identity.is_alive():
            tree.sample()  # learn the members now: once orphaned they are no longer root's descendants
            time.sleep(poll_s)
        tree.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and tree.poll() is None:
            time.sleep(min(poll_s, grace_s))
        tree.signal_tree(signal.SIGKILL)
        return True
    finally:
        tree.close()


def main(argv: list[str]) -> int:
    watched, root, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    try:
        reap(watched, root, grace_s)
    except ValueError as exc:
        print(f"stella reaper: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
