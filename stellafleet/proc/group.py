"""Stopping a process group: the one way stella ends a command together with everything it started.

Every command stella runs for someone else (a worker, an agent CLI, a shell tool call) starts in its own
session, so its process group holds the command and whatever it spawned. Stopping is SIGTERM to the
group, a grace period for it to end, then SIGKILL to whatever is left: members of a group may outlive its
leader, and the group id stays theirs while any member lives. A group that is already gone is not an
error, nor one we may not signal (its members changed owner: they are no longer ours to stop).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

GROUP_POLL_S = 0.01  # how often a stop without a leader to wait on looks whether the group has ended


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


def stop_group(pgid: int, grace_s: float, *, leader: subprocess.Popen[Any] | None = None) -> None:
    """SIGTERM to group pgid, up to grace_s for it to end, then SIGKILL to whatever is left.

    With grace_s <= 0 the group is killed at once. Pass the leader when it is our own child: its exit ends
    the wait (an unreaped child keeps its group alive) and it is reaped before this returns."""
    if grace_s > 0 and signal_group(pgid, signal.SIGTERM):
        if leader is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                leader.wait(timeout=grace_s)
        else:
            deadline = time.monotonic() + grace_s
            while group_exists(pgid) and time.monotonic() < deadline:
                time.sleep(min(GROUP_POLL_S, max(deadline - time.monotonic(), 0.0)))
    signal_group(pgid, signal.SIGKILL)
    if leader is not None:
        leader.wait()
