"""`python -m stellafleet.proc.reaper WATCHED ROOT GRACE`: end ROOT's process tree once WATCHED is gone.

ROOT is a pid, or a file the pid will be written to (so the reaper can start before the worker does); the
file's directory is the attempt's scratch directory, removed once the tree has been stopped. Or ROOT is a
directory: the reaper is then kept for every attempt WATCHED runs, each naming its tree by a `*.pid` file
there while it runs (`reap_all`).

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
import shutil
import signal
import sys
import time
from pathlib import Path

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


def read_root(source: int | Path) -> int | None:
    """The root's pid: given, or once its starter has written it to the file (None: not yet)."""
    if isinstance(source, int):
        return source
    try:
        return int(source.read_text())
    except (OSError, ValueError):
        return None


def reap(watched: int, root_source: int | Path, grace_s: float, *, poll_s: float = POLL_S) -> bool:
    """Wait while watched runs, then stop root's tree; False when there was nothing to stop (the tree
    ended by itself, or no root was ever named and its file's directory is gone).

    The root may be named by a file its starter writes once it has started it: then the reaper can be
    running before the worker is, and a cancel at any moment finds it watching."""
    identity = ProcessIdentity.of(watched)  # None: it is gone already
    members: Members | None = None
    while True:
        if members is None:
            root = read_root(root_source)
            if root is not None:
                check_root(root)
                members = Members(root)
            elif isinstance(root_source, Path) and not root_source.parent.exists():
                return False  # the attempt is over and its scratch directory removed
        if identity is None or not identity.is_alive():
            break
        if members is not None:
            members.learn()  # now: once orphaned, members are no longer root's descendants
            if not members.alive():
                return False
        time.sleep(poll_s)
    if members is None:
        return False
    members.learn()
    members.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while members.alive() and time.monotonic() < deadline:
        time.sleep(min(poll_s, grace_s))
    members.signal(signal.SIGKILL)
    if isinstance(root_source, Path):  # the root file's directory is the attempt's scratch: nobody else
        shutil.rmtree(root_source.parent, ignore_errors=True)  # is left to remove it
    return True


def _roots_in(directory: Path) -> dict[str, tuple[int, Path | None]]:
    """The trees a kept reaper watches now: each `*.pid` file's pid, and the directory to remove once that
    tree was stopped (the file's second line, if any). A file being written (no pid yet) is left for the
    next look."""
    found: dict[str, tuple[int, Path | None]] = {}
    for path in directory.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = path.read_text().splitlines()
            found[path.name] = (int(lines[0]), Path(lines[1]) if len(lines) > 1 and lines[1] else None)
    return found


def reap_all(watched: int, directory: Path, grace_s: float, *, poll_s: float = POLL_S) -> int:
    """The kept reaper of one process that runs many attempts one after another (a Ray worker): while
    watched runs, every `*.pid` file in directory names a worker tree to learn (its starter removes the
    file once the tree has ended); once watched is gone, stop the trees still named and remove directory.
    Returns how many trees it stopped. One such reaper serves every attempt of its process: an attempt
    pays for a file, not for a new reaper process."""
    identity = ProcessIdentity.of(watched)
    trees: dict[str, tuple[Members, Path | None]] = {}
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
                trees[name] = (Members(root), scratch)
            trees[name][0].learn()  # now: once orphaned, members are no longer root's descendants
        if identity is None or not identity.is_alive() or not directory.is_dir():
            break
        time.sleep(poll_s)
    live = [(members, scratch) for members, scratch in trees.values() if members.alive()]
    for members, _ in live:
        members.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(members.alive() for members, _ in live) and time.monotonic() < deadline:
        time.sleep(min(poll_s, grace_s))
    for members, scratch in live:
        members.signal(signal.SIGKILL)
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
    if argv and argv[0] == "--detach":
        argv = argv[1:]
        detach()
    watched, grace_s = int(argv[0]), float(argv[2])
    root: int | Path = int(argv[1]) if argv[1].isdigit() else Path(argv[1])
    try:
        if isinstance(root, Path) and root.is_dir():
            reap_all(watched, root, grace_s)
        else:
            reap(watched, root, grace_s)
    except ValueError as exc:
        print(f"stella reaper: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
