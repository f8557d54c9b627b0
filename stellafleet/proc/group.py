"""The one stop (SIGTERM, grace, SIGKILL) of a set: a process group, what is below its members, and what
carries an attempt's identity in its environment (a double fork leaves the tree, never the environment)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # imported when a set is made: a worker that never stops one starts without psutil
    import psutil

# in the environment of an attempt's processes: its repository, its run, its attempt (ids are per ledger)
IDENTITY_KEYS = ("STELLA_ROOT", "STELLA_RUN_ID", "STELLA_ATTEMPT_ID")
POLL_S = 0.01  # how often a stop looks whether its set has ended
KILL_ROUNDS = 50  # a member forking as it is killed shows up in the next round


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


def identity_in(env: Mapping[str, str]) -> dict[str, str]:
    """The attempt identity env carries (empty when it carries none of it)."""
    return {key: env[key] for key in IDENTITY_KEYS if key in env}


def carrying(identity: Mapping[str, str], *, born: float = 0.0) -> list[psutil.Process]:
    """The processes whose environment holds all of identity, never this one nor its ancestors, nor any
    when it is this process's own; those started before born predate the attempt and are never read."""
    import psutil

    from stellafleet.proc.pids import started_after

    if len(identity) < len(IDENTITY_KEYS) or identity_in(os.environ) == identity:
        return []
    me = psutil.Process()
    ours = {me.pid, *(proc.pid for proc in me.parents())}
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        if proc.pid in ours:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if born and started_after(born, proc.create_time()):
                continue
            environ = proc.environ()
            if all(environ.get(key) == value for key, value in identity.items()):
                found.append(proc)
    return found


def working_in(path: Path) -> list[psutil.Process]:
    """The processes (never this one) whose current directory is path or below it, or whose environment
    names path as their attempt's workspace: a setup's make, a worker, a user's shell."""
    import psutil

    inside = str(path.resolve())
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error, OSError):
            cwd = proc.cwd()
            if f"{cwd}{os.sep}".startswith(inside + os.sep) or proc.environ().get("STELLA_WORKSPACE") == str(
                path
            ):
                found.append(proc)
    return found


def live(proc: psutil.Process) -> bool:
    """Whether proc still runs (a zombie has ended: it only waits to be reaped): rule 2 (proc/pids.py)."""
    import psutil

    from stellafleet.proc.pids import ProcessIdentity

    try:
        return ProcessIdentity(proc.pid, proc.create_time()).is_alive()
    except psutil.Error:
        return False


class ProcessSet:
    """The processes one stop ends. Members are psutil handles, which refuse a pid reused since; below
    names a process (this one, as a subreaper) whose descendants are members but not itself."""

    def __init__(
        self,
        *pids: int,
        group: int | None = None,
        leader: Leader | None = None,
        identity: Mapping[str, str] | None = None,
        below: int | None = None,
    ) -> None:
        import psutil

        self.group = group
        self.leader = leader
        self.identities = [found] if (found := identity_in(identity or {})) else []
        self.below = below
        self.born = 0.0  # when the attempt began, if known: older processes cannot carry its identity
        self.known: dict[int, psutil.Process] = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self.add([psutil.Process(pid)])

    def add(self, procs: Iterable[psutil.Process]) -> None:
        for proc in procs:
            self.known.setdefault(proc.pid, proc)

    def learn(self, *, sweep: bool = False) -> None:
        """Add every live process below the live members (one look at the process table); with sweep,
        every process carrying one of the identities too."""
        import psutil

        tops = [pid for pid, proc in self.known.items() if live(proc)]
        if self.below is not None:
            tops.append(self.below)
        children: dict[int, list[psutil.Process]] = {}
        for proc in psutil.process_iter(["ppid", "status"]) if tops else []:
            if proc.info["status"] != psutil.STATUS_ZOMBIE:
                children.setdefault(proc.info["ppid"], []).append(proc)
        stack, seen = tops, set()
        while stack:
            pid = stack.pop()
            if pid not in seen:
                seen.add(pid)
                found = children.get(pid, [])
                self.add(found)
                stack.extend(proc.pid for proc in found)
        for identity in self.identities if sweep else []:
            self.add(carrying(identity, born=self.born))

    def alive(self) -> list[psutil.Process]:
        """The members still running (a zombie has ended: it only waits to be reaped)."""
        return [proc for proc in self.known.values() if live(proc)]

    def signal(self, sig: int, *, sweep: bool = True) -> bool:
        """Send sig to the group and every live member, learned now; whether anything got it."""
        import psutil

        self.learn(sweep=sweep)
        sent = self.group is not None and signal_group(self.group, sig)
        for proc in self.alive():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                sent = True
        return sent

    def running(self) -> bool:
        if self.leader is not None:
            return self.leader.poll() is None
        return bool(self.alive()) or (self.group is not None and group_exists(self.group))

    def stop(self, grace_s: float) -> None:
        """SIGTERM to all, up to grace_s for them to end (the leader's exit ends it), then SIGKILL until
        no member is left; the leader is reaped before this returns. grace_s <= 0: killed at once."""
        if grace_s > 0 and self.signal(signal.SIGTERM):
            deadline = time.monotonic() + grace_s
            while self.running() and time.monotonic() < deadline:
                time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
        self.signal(signal.SIGKILL)
        for _ in range(KILL_ROUNDS):
            self.learn()
            if not self.alive():
                break
            time.sleep(POLL_S)
            self.signal(signal.SIGKILL, sweep=False)
        if self.leader is not None:
            self.leader.wait()


def stop_group(pgid: int, grace_s: float, *, leader: Leader | None = None) -> None:
    """Stop process group pgid (a command started in a session of its own: its pid); see ProcessSet.stop."""
    ProcessSet(group=pgid, leader=leader).stop(grace_s)
