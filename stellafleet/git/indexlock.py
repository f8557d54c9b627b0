"""Git's index lock, taken as git does, held to install an index and move HEAD. Naming its holder, a killed
stella's is removed; it lingers while a `git commit` that read the old index may write it back (linger)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, index
from stellafleet.proc.group import live
from stellafleet.proc.pids import ProcessIdentity

MARKER = "stella-index-lock"
LOCK_WAIT_S = 10.0
LOCK_POLL_S = 0.005
LINGER_S = 0.1  # the most the lock is held for a git process that may have read the replaced index
LINGER_POLL_S = 0.002
ASIDE_PREFIX = ".stella-"
_serial = itertools.count()


def index_file(root: Path) -> Path:
    """The index of root's work tree (a linked worktree has its own)."""
    return gitops.git_path(root, "--git-path", "index")


def _aside(index: Path, what: str) -> Path:
    """A file beside index for this process, named with its pid and start time: `index.stella-new3-PID-MS`."""
    me = ProcessIdentity.of()
    assert me is not None
    return index.with_name(f"{index.name}{ASIDE_PREFIX}{what}-{me.pid}-{round(me.started_at * 1000)}")


def _maker(leftover: str) -> ProcessIdentity | None:
    """The process an aside file's name says made it (git may have added `.lock`); None for an older
    stella's names (its pid alone, its note `installed`)."""
    _, *owner = leftover.split(".")[0].split("-")
    if len(owner) != 2 or not all(part.isdigit() for part in owner):
        return None
    return ProcessIdentity(int(owner[0]), int(owner[1]) / 1000)


def identity(path: Path) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns}"


def head_now(root: Path, index: Path) -> str | None:
    """HEAD's commit of root, whose index this is (read from the ref files when it can, no lock)."""
    return gitops.head_from_files(index.parent) or gitops.ref_commit(root, "HEAD")


def stale_marker(lock: Path) -> int | None:
    """The pid of a dead stella process that left lock behind; None for a live holder or git's own lock."""
    try:
        marker, pid, started = lock.read_text(errors="replace")[:200].split()
        holder = ProcessIdentity(int(pid), float(started))
    except (OSError, ValueError):  # no lock, or not three words with a pid: not a stella's marker
        return None
    return None if marker != MARKER or holder.is_alive() else holder.pid


def remove_dead_leftovers(index: Path) -> list[Path]:
    """index.lock left by a dead stella, and the aside files (`index.stella-*-PID-MS`) of dead stella
    processes; returns what was removed. A live holder's files and git's own lock are left alone."""
    removed: list[Path] = []
    lock = index.with_name(index.name + ".lock")
    if stale_marker(lock) is not None:
        with contextlib.suppress(OSError):
            lock.unlink()
            removed.append(lock)
    for leftover in index.parent.glob(f"{index.name}{ASIDE_PREFIX}*"):
        maker = _maker(leftover.name[len(index.name) + len(ASIDE_PREFIX) :])
        if maker is None or not maker.is_alive():
            with contextlib.suppress(OSError):
                leftover.unlink()
                removed.append(leftover)
    return removed


@dataclass
class Update:
    """A prepared index aside: the real one (as it was when copied) with exactly some entries changed."""

    staged: Path
    real: Path
    source: str | None  # the identity of the real index it was copied from
    before: dict[str, tuple[str, str]]  # the changed paths' entries in the real index, as copied
    entries: Mapping[str, tuple[str, str]]
    removed: tuple[str, ...]

    def current(self) -> bool:
        """Whether the real index is still the one copied."""
        return identity(self.real) == self.source

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.staged.unlink()


def prepare_update(
    root: Path,
    entries: Mapping[str, tuple[str, str]],
    removed: Sequence[str],
    *,
    real: Path,
    quick: bool = False,
) -> Update:
    """The real index with exactly these entries set (or removed), prepared aside. quick (under the lock):
    only that; else also the stat data refreshed and the cache tree complete, as `git commit` leaves it."""
    staged = _aside(real, f"new{next(_serial)}")
    env = index.with_index(staged)
    source = _copy(real, staged)
    if source is None:
        gitops.git("read-tree", "--empty", cwd=root, env=env)
    before = index.file_entries(root, staged, [*entries, *removed]) if source and not quick else {}
    index.set_entries(root, staged, entries, removed)
    if not quick:
        # --refresh only rewrites stat data of entries whose content matches the work tree; it exits 1
        # when some entry (the user's unstaged work) does not, which is expected here.
        gitops.git("update-index", "-q", "--refresh", cwd=root, env=env, check=False)
        gitops.git("write-tree", cwd=root, env=env, check=False)  # the cache tree, stored in the index
    return Update(staged, real, source, before, dict(entries), tuple(removed))


def refreshed(root: Path, update: Update) -> Update:
    """update, or (when the real index changed since it was copied) the same update prepared again."""
    if update.current():
        return update
    update.discard()
    again = prepare_update(root, update.entries, update.removed, real=update.real, quick=True)
    again.before = update.before  # these paths are the lane's own: what the copy had is what they had
    return again


def _copy(real: Path, staged: Path) -> str | None:
    """Copy the real index to staged; the identity of the one copied (None: there is no index yet)."""
    for _ in range(5):
        source = identity(real)
        if source is None:
            return None
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(real, staged)  # git writes an index by rename: the copy is one whole index
            if identity(real) == source:
                return source
    return None if identity(real) is None else "changing"  # `refreshed` prepares it again


def _may_write(proc: psutil.Process, index: Path) -> bool:
    """Whether a git process may write this index: not one pointed at a private one, as stella's are."""
    try:
        other = proc.environ().get("GIT_INDEX_FILE")
    except psutil.Error:
        return True
    return other is None or not os.path.isabs(other) or Path(other) == index


class IndexLock:
    """index.lock held by this process; install prepared updates of the real index under it."""

    def __init__(self, root: Path, index: Path, marker: Path) -> None:
        self.root = root
        self.index = index
        self.lock = index.with_name(index.name + ".lock")
        self._marker = marker
        self._installed_at: float | None = None

    @classmethod
    @contextlib.contextmanager
    def held(cls, root: Path, *, index: Path | None = None) -> Iterator[IndexLock]:
        """Hold root's index.lock for the body, waiting (LOCK_WAIT_S) while another git process holds it."""
        identity = ProcessIdentity.of()
        assert identity is not None
        index = index_file(root) if index is None else index
        marker = _aside(index, "lock")
        marker.write_text(f"{MARKER} {identity.pid} {identity.started_at!r}\n")
        lock = cls(root, index, marker)
        try:
            lock._acquire()
            yield lock
        finally:
            lock._release()  # only a lock that is this marker: never another's, when none was taken
            with contextlib.suppress(OSError):
                marker.unlink()

    def _acquire(self) -> None:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            with contextlib.suppress(FileExistsError):
                os.link(self._marker, self.lock)  # atomic, and fails when the lock exists: git's O_EXCL
                return
            if stale_marker(self.lock) is not None:
                remove_dead_leftovers(self.index)
                continue
            if time.monotonic() >= deadline:
                raise GitError(
                    f"another git process has held {self.lock} for {LOCK_WAIT_S:g}s; nothing was committed: "
                    "try again (if no git command is running, remove that file)"
                )
            time.sleep(LOCK_POLL_S)

    def install(self, update: Update) -> None:
        """Put the prepared index in place (one rename: readers see the old index or the new one)."""
        os.replace(update.staged, self.index)
        self._installed_at = time.time()

    def match_head(self, paths: Sequence[str]) -> None:
        """Set these paths' entries to HEAD's (removing those HEAD lacks), and install that index."""
        head = gitops.ref_commit(self.root, "HEAD")
        entries = index.tree_entries(self.root, head, paths) if head else {}
        self.restore(entries, [p for p in paths if p not in entries])

    def restore(self, entries: Mapping[str, tuple[str, str]], removed: Sequence[str]) -> None:
        """Set exactly these entries of the real index (removing the removed), under the lock."""
        self.install(prepare_update(self.root, entries, removed, real=self.index, quick=True))

    def linger(self) -> None:
        """Hold the lock while a git process that started before the install may still write this index:
        it then fails at the lock instead of writing back the index it read. Released at once when none."""
        if self._installed_at is None:
            return
        deadline = time.monotonic() + LINGER_S
        racing = gitops.git_processes_in(self.root, started_before=self._installed_at)
        racing = [proc for proc in racing if _may_write(proc, self.index)]
        while racing and time.monotonic() < deadline:
            time.sleep(LINGER_POLL_S)
            racing = [proc for proc in racing if live(proc)]

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.lock).st_ino == os.stat(self._marker).st_ino:
                self.lock.unlink()
