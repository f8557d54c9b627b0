"""Stopping a process group: the one way stella ends a command together with everything it started.

Every command stella runs for someone else (a worker, an agent CLI, a shell tool call) starts in its own
session, so its process group holds the command and whatever it spawned. Stopping is SIGTERM to the
group, a grace period for it to end, then SIGKILL to whatever is left: members of a group may outlive its
leader, and the group id stays theirs while any member lives. A group that is already gone is not an
error, nor one we may not signal (its members changed owner: they are no longer ours to stop).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Protocol

GROUP_POLL_S = 0.01  # how often a stop looks whether the group (or its leader) has ended


class Leader(Protocol):
    """Our own child leading the group (a Popen): its exit ends the grace, and it is reaped."""

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to process group pgid; False when there is no such group or it is not ours to signal."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_exists(pgid: int) -> bool:
    """True while process group pgid has a member (a zombie not yet reaped counts)."""
    return signal_group(pgid, 0)


def _running(pgid: int, leader: Leader | None) -> bool:
    return group_exists(pgid) if leader is None else leader.poll() is None


def stop_group(pgid: int, grace_s: float, *, leader: Leader | None = None) -> None:
    """SIGTERM to group pgid, up to grace_s for it to end, then SIGKILL to whatever is left.

    With grace_s <= 0 the group is killed at once. Pass the leader when it is our own child: its exit ends
    the wait (an unreaped child keeps its group alive) and it is reaped before this returns."""
    if grace_s > 0 and signal_group(pgid, signal.SIGTERM):
        deadline = time.monotonic() + grace_s
        while _running(pgid, leader) and time.monotonic() < deadline:
            time.sleep(min(GROUP_POLL_S, max(deadline - time.monotonic(), 0.0)))
    signal_group(pgid, signal.SIGKILL)
    if leader is not None:
        leader.wait()
