"""`python -m stellafleet.proc.reaper [--detach] WATCHED DIRECTORY GRACE` ends WATCHED's worker trees once it
dies (a dead Ray worker's would live on, spending); detached, as Ray kills a dying worker's children."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

import psutil

from stellafleet.proc.group import ProcessSet, identity_in
from stellafleet.proc.pids import ProcessIdentity

POLL_S = 0.2


def check_root(root: int) -> None:
    """Refuse a root whose tree would hold this process or the whole system (pid 1, an ancestor)."""
    ancestors = {proc.pid for proc in psutil.Process().parents()}
    if root <= 1 or root == os.getpid() or root in ancestors:
        raise ValueError(f"refusing to watch the tree of pid {root}: it is this process, init or an ancestor")


def _tree(root: int) -> ProcessSet:
    """root's tree, swept at its stop by the attempt identity root's environment carries."""
    try:
        environ = psutil.Process(root).environ()
    except (psutil.Error, OSError):
        environ = {}
    return ProcessSet(root, identity=identity_in(environ))


def _roots_in(directory: Path) -> dict[str, tuple[int, Path | None]]:
    """The trees to watch now: each `*.pid` file's pid, and the directory to remove once it was stopped
    (the file's second line, if any); a file being written is left for the next look."""
    found: dict[str, tuple[int, Path | None]] = {}
    for path in directory.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = path.read_text().splitlines()
            found[path.name] = (int(lines[0]), Path(lines[1]) if len(lines) > 1 and lines[1] else None)
    return found


def reap_all(watched: int, directory: Path, grace_s: float, *, poll_s: float = POLL_S) -> int:
    """While watched runs, learn the worker trees the `*.pid` files in directory name; once it is gone,
    stop the trees still named and remove directory. How many trees it stopped."""
    identity = ProcessIdentity.of(watched)
    trees: dict[str, tuple[ProcessSet, Path | None]] = {}
    while True:
        roots = _roots_in(directory)
        for name in [name for name in trees if name not in roots]:
            del trees[name]  # its attempt is over: the tree ended with it
        for name, (root, scratch) in roots.items():
            if name not in trees:
                try:
                    check_root(root)
                except ValueError:
                    continue  # never this process, init or an ancestor; the other trees stay watched
                trees[name] = (_tree(root), scratch)
            trees[name][0].learn()  # now: once orphaned, members are no longer root's descendants
        if identity is None or not identity.is_alive() or not directory.is_dir():
            break
        time.sleep(poll_s)
    live = [(members, scratch) for members, scratch in trees.values() if members.alive()]
    everything = ProcessSet()  # one stop, one grace, for all of them
    for members, _ in live:
        everything.add(members.known.values())
        everything.identities.extend(members.identities)
    everything.stop(grace_s)
    for _, scratch in live:
        if scratch is not None:  # the attempt's scratch directory: nobody else is left to remove it
            shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    return len(live)


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
    detached = bool(argv) and argv[0] == "--detach"
    args = argv[1:] if detached else argv
    watched, directory, grace_s = int(args[0]), Path(args[1]), float(args[2])
    if not directory.is_dir():
        print(f"stella reaper: {directory} is not a directory", file=sys.stderr)
        return 2
    if detached:
        detach()
    reap_all(watched, directory, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
