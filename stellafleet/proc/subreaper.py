"""Linux's child subreaper keeps every descendant (a double fork's orphan too), so none outlives it; the
worker and the wrapper `python -m stellafleet.proc.subreaper -- ARGV` become one. An orphaned worker ends."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from stellafleet.proc.group import ProcessSet, signal_group

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 1.0
ORPHAN_POLL_S = 0.25


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


def end_descendants(grace_s: float = LEFTOVER_GRACE_S) -> int:
    """Stop every descendant of this process (proc/group.py's stop) and reap them; how many there were."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0  # a descendant without a living parent would be our child: there is none
    descendants = ProcessSet(below=os.getpid())
    descendants.stop(grace_s)
    with contextlib.suppress(ChildProcessError):  # reap every ended child (the orphans handed to us too)
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return len(descendants.known)


def _watch(parent: int, interval: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval)
    # Orphaned: the fleet is gone. Everything this worker started goes with it (also what left its group).
    end_descendants(0.0)
    if os.getpgrp() == os.getpid():
        signal_group(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def end_when_orphaned(interval: float = ORPHAN_POLL_S) -> threading.Thread | None:
    """Start a daemon thread that kills this process and its group once its parent is gone: a killed
    fleet leaves no worker writing files and committing unnoticed."""
    parent = os.getppid()
    if parent == 1:
        return None  # started by init (or already orphaned): nothing to watch
    thread = threading.Thread(target=_watch, args=(parent, interval), name="stella-orphan", daemon=True)
    thread.start()
    return thread


def on_sigterm(handler: Callable[[int], None]) -> None:
    """handler(signum) on the first SIGTERM only (a stop signals more than once). psutil, which
    end_descendants needs, is loaded first: a TERM landing mid-import would break the handler's import."""
    import psutil  # noqa: F401

    def once(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        handler(signum)

    signal.signal(signal.SIGTERM, once)


def reaped_argv(argv: Sequence[str], *, with_parent: bool = False) -> list[str]:
    """argv run under the subreaper wrapper (this module as a program) where there is a subreaper;
    with_parent: its whole tree ends once the process that started it is gone."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [
        sys.executable,
        "-P",
        "-m",
        "stellafleet.proc.subreaper",
        *(["--orphan"] if with_parent else []),
        "--",
        *argv,
    ]


def main(argv: Sequence[str]) -> int:
    """The wrapper: become a subreaper, run argv, end what it left behind, exit as it did. A SIGTERM
    (a timeout stopping our group) ends argv's whole tree, double-forked orphans included; with --orphan
    so does the death of the process that started it (a SIGKILLed fleet's setup)."""
    from stellafleet.proc import runner  # the one place a program starts

    args = list(argv)
    orphan = bool(args) and args[0] == "--orphan"
    args = args[1:] if orphan else args
    args = args[1:] if args and args[0] == "--" else args
    if (
        orphan and os.getpgrp() == os.getpid()
    ):  # in its own session: it (and argv's tree) ends with its parent
        end_when_orphaned()
    become_subreaper()

    def stop(signum: int) -> None:
        end_descendants()
        os._exit(128 + signum)

    on_sigterm(stop)
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
