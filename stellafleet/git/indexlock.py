"""Git's own index lock, taken the way git takes it, so a lane commit and the user's git never interleave.

Every git command that writes the index first creates `index.lock` beside it (exclusively), writes the
new index there and renames it over the index. A lane commit does the same: it takes `index.lock`
(waiting a bounded time while another git process holds it), prepares the updated index aside, moves
HEAD, and only then installs the index, so to any other git command HEAD and the index change together.
The lock file names its holder (stella's pid and start time): one left behind by a killed stella is
removed by the next lane commit; one held by git itself is only ever waited for.

`git commit` reads the index before it takes index.lock and installs its refreshed copy before it moves
HEAD: one that read the index just before a lane commit installed its own, and locks it just after, puts
back an index without the lane's paths (its own commit then fails, HEAD having moved, but the next one
would delete them). Such a copy needs writing only when the index it read was not stella's own (stella's
carries a complete cache tree and fresh stat data, which `git commit` leaves as they are). So when the
index a lane commit replaces was written by another git process, the lock is held a moment longer
(LINGER_S): a `git commit` that read the old index meets the lock and fails before writing anything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, index
from stellafleet.proc.pids import ProcessIdentity

MARKER = "stella-index-lock"
LOCK_WAIT_S = 10.0
LOCK_POLL_S = 0.01
# Longer than the step of `git commit` from reading the index (and stat-ing the work tree) to locking it.
LINGER_S = 0.1


def index_file(root: Path) -> Path:
    """The index of root's work tree (a linked worktree has its own)."""
    return gitops.git_path(root, "--git-path", "index")


def _aside(index: Path, pid: int, what: str) -> Path:
    return index.with_name(f"{index.name}.stella-{what}-{pid}")


def _installed_note(index: Path) -> Path:
    return index.with_name(f"{index.name}.stella-installed")


def _identity(path: Path) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns}"


def _written_by_stella(index: Path) -> bool:
    """Whether index is the one a lane commit installed last (not since rewritten by another git)."""
    try:
        noted = _installed_note(index).read_text()
    except OSError:
        return False
    return noted == _identity(index)


def _stale_marker(lock: Path) -> int | None:
    """The pid of a dead stella process that left lock behind; None for a live holder or git's own lock."""
    try:
        text = lock.read_text(errors="replace")[:200]
    except OSError:
        return None
    parts = text.split()
    if len(parts) != 3 or parts[0] != MARKER:
        return None
    try:
        identity = ProcessIdentity(int(parts[1]), float(parts[2]))
    except ValueError:
        return None
    return None if identity.is_alive() else identity.pid


class IndexLock:
    """index.lock held by this process; prepare an updated index aside, then install it."""

    def __init__(self, index: Path, marker: Path) -> None:
        self.index = index
        self.lock = index.with_name(index.name + ".lock")
        self._marker = marker
        self._staged: Path | None = None
        self.replaces_foreign = False

    @classmethod
    @contextlib.contextmanager
    def held(cls, root: Path, *, timeout: float | None = None) -> Iterator[IndexLock]:
        """Hold root's index.lock for the body, waiting (LOCK_WAIT_S) while another git process holds it."""
        timeout = LOCK_WAIT_S if timeout is None else timeout
        identity = ProcessIdentity.of()
        assert identity is not None
        index = index_file(root)
        marker = _aside(index, identity.pid, "lock")
        marker.write_text(f"{MARKER} {identity.pid} {identity.started_at!r}\n")
        lock = cls(index, marker)
        try:
            lock._acquire(time.monotonic() + timeout, timeout)
            lock.replaces_foreign = not _written_by_stella(index)
            try:
                yield lock
            finally:
                lock._release()
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()

    def _acquire(self, deadline: float, timeout: float) -> None:
        while True:
            try:
                os.link(self._marker, self.lock)  # atomic, and fails when the lock exists: git's O_EXCL
                return
            except FileExistsError:
                pass
            dead = _stale_marker(self.lock)
            if dead is not None:
                for leftover in (
                    self.lock,
                    _aside(self.index, dead, "lock"),
                    _aside(self.index, dead, "new"),
                    _aside(self.index, dead, "noting"),
                ):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
                continue
            if time.monotonic() >= deadline:
                raise GitError(
                    f"another git process has held {self.lock} for {timeout:g}s; nothing was committed: "
                    "try again (if no git command is running, remove that file)"
                )
            time.sleep(LOCK_POLL_S)

    def prepare(
        self, root: Path, entries: Mapping[str, tuple[str, str]], removed: Sequence[str], *, null_oid: str
    ) -> None:
        """The index as it is with exactly these entries set (or removed), stat data refreshed, aside."""
        staged = _aside(self.index, os.getpid(), "new")
        env = index.with_index(staged)
        if self.index.exists():
            shutil.copyfile(self.index, staged)
        else:
            gitops.git("read-tree", "--empty", cwd=root, env=env)
        self._staged = staged
        lines = [f"{mode} {sha}\t{path}\0" for path, (mode, sha) in entries.items()]
        lines += [f"0 {null_oid}\t{path}\0" for path in removed]
        gitops.git("update-index", "-z", "--index-info", cwd=root, env=env, stdin="".join(lines))
        # --refresh only rewrites stat data of entries whose content matches the work tree; it exits 1
        # when some entry (the user's unstaged work) does not, which is expected here.
        gitops.git("update-index", "-q", "--refresh", cwd=root, env=env, check=False)
        # A complete cache tree (write-tree stores it in the index) leaves a `git commit` that read the
        # index just before this one is installed nothing to write back over it: git commit reads the
        # index before it takes index.lock, and rewrites it after only when it changed something.
        gitops.git("write-tree", cwd=root, env=env, check=False)

    def match_head(self, root: Path, paths: Sequence[str]) -> None:
        """Set these paths' entries to HEAD's (removing those HEAD lacks), and install that index."""
        head = gitops.ref_commit(root, "HEAD")
        entries = index.tree_entries(root, head, paths) if head else {}
        self.prepare(
            root, entries, [p for p in paths if p not in entries], null_oid="0" * len(head or "0" * 40)
        )
        self.install()

    def install(self) -> None:
        """Put the prepared index in place (one rename: readers see the old index or the new one)."""
        assert self._staged is not None
        os.replace(self._staged, self.index)
        self._staged = None
        identity = _identity(self.index)
        if identity is not None:
            noted = _aside(self.index, os.getpid(), "noting")
            noted.write_text(identity)
            os.replace(noted, _installed_note(self.index))

    def linger(self) -> None:
        """Hold the lock a moment more when the index replaced was another git's (see the module's note)."""
        if self.replaces_foreign:
            time.sleep(LINGER_S)

    def _release(self) -> None:
        if self._staged is not None:
            with contextlib.suppress(OSError):
                self._staged.unlink()
        with contextlib.suppress(OSError):
            if os.stat(self.lock).st_ino == os.stat(self._marker).st_ino:
                self.lock.unlink()
