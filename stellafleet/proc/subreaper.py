"""A process that keeps every descendant it ever had, so none outlives it: Linux's child subreaper.

A process that double-forks (fork, setsid, fork again, the middle one exits) leaves the process group and
the tree of whoever started it: its orphan is handed to init, and nothing stella watches would see it.
A child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`) is handed those orphans instead, so they stay its
descendants: the worker (the process that owns an attempt's tree) and the notify command's wrapper
(`python -m stellafleet.proc.subreaper -- ARGV`) become one, and end everything below them before they
end themselves. Elsewhere than Linux there is no subreaper: only the process group and the tree seen
while it ran are ended (proc/tree.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # psutil and ctypes are imported when needed: a worker starts without them
    import psutil

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 1.0
KILL_ROUNDS = 50  # SIGKILL rounds: a process forking as it is killed shows up in the next round


def become_subreaper() -> bool:
    """Make this process its orphaned descendants' new parent; False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _descendants() -> list[psutil.Process]:
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _send(procs: Sequence[psutil.Process], sig: int) -> None:
    import psutil

    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil refuses a pid that was reused by another process
        except psutil.Error:
            continue


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _reap() -> None:
    """Collect the exit of every child that has ended (the orphans handed to us are ours to reap)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(grace_s: float = LEFTOVER_GRACE_S) -> int:
    """SIGTERM to every descendant of this process, up to grace_s for them to end, then SIGKILL to
    whatever is left (again, until none is left); all are reaped. Returns how many there were."""
    if not _has_children():
        return 0  # a descendant without a living parent would be our child: there is none
    found = [p for p in _descendants() if not _zombie(p)]
    count = len(found)
    if found:
        _send(found, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.is_running() and not _zombie(p) for p in found):
            _reap()
            time.sleep(0.02)
    for _ in range(KILL_ROUNDS):
        _reap()
        left = [p for p in _descendants() if not _zombie(p)]
        if not left:
            break
        count += len({p.pid for p in left} - {p.pid for p in found})
        found.extend(left)
        _send(left, signal.SIGKILL)
        time.sleep(0.01)
    _reap()
    return count


def _zombie(proc: psutil.Process) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def reaped_argv(argv: Sequence[str]) -> list[str]:
    """argv run under the subreaper wrapper (this module as a program) where there is a subreaper."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-P", "-m", "stellafleet.proc.subreaper", "--", *argv]


def main(argv: Sequence[str]) -> int:
    """The wrapper: become a subreaper, run argv, end what it left behind, exit as it did. A SIGTERM
    (a timeout stopping our group) ends argv's whole tree, double-forked orphans included."""
    from stellafleet.proc import runner  # the one place a program starts

    args = list(argv[1:] if argv and argv[0] == "--" else argv)
    become_subreaper()

    def stop(signum: int, frame: object) -> None:
        end_descendants()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        proc = runner.start(
            args, stdin=runner.INHERIT, stdout=runner.INHERIT, stderr=runner.INHERIT, session=False
        )
    except (OSError, IndexError) as exc:
        print(f"stella: cannot start {args[0] if args else '(nothing)'}: {exc}", file=sys.stderr)
        return 127
    with proc:
        code = proc.wait()
    end_descendants()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
