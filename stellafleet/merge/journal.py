"""stella merge's journal: what a running merge holds outside the ledger, so a killed one is finished
by the next stella command.

A merge holds `.stella/private/merge.lock` (an exclusive flock, which the kernel lets go of when the
process dies, however it dies) for as long as it runs, and keeps `merge-journal.json` next to it: its
scratch directory and worktree, the ledger row of the branch it is on, the check command's process while
one runs, the resolve task while one runs (--resolve: merge/killedresolve.py finishes it), and, around
the one step git cannot do atomically (the branch ref moves, then the index and the files follow), the
old and new commit. The next stella command that finds the journal and can take the lock knows the merge
is dead and finishes its work (`repair`): the check's process group is stopped, a ref that moved gets its
index and files (a ref that did not is left as it was; git's own index.lock, which a read-tree killed
with the merge leaves, is removed when it is provably that git's), the `planned` row becomes `merged`
only when the branch is verifiably in the branch it landed on (else `error`), and the scratch worktree
and directory are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stellafleet.core.errors import EXIT_USAGE, GitError, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import MergeStatus
from stellafleet.git import gitops, mergeops, worktrees
from stellafleet.merge import killedresolve
from stellafleet.proc.group import stop_group
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.state.ledger import Ledger

LOCK_NAME = "merge.lock"
CHECK_STOP_GRACE_S = 2.0
LOCK_CLOCK_SLACK_S = 2.0  # file times may be coarse: a lock made just after the journal may look older
PROCESS_CLOCK_TICK_S = 0.05  # a process's start time is known to a clock tick (and boot-time rounding)


def _paths(root: Path) -> tuple[Path, Path]:
    paths = StatePaths(root)
    return paths.private / LOCK_NAME, paths.merge_journal


def _take(lock_path: Path) -> int | None:
    """The lock's file descriptor, held; None when a live process holds it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


class Journal:
    """The running merge's journal; every change is written atomically before the step it covers."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: a dry run's, which writes nothing
        self.data: dict[str, Any] = {"pid": os.getpid()}

    def note(self, **fields: Any) -> None:
        self.data.update(fields)
        if self.path is None:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def check_started(self, pid: int) -> None:
        who = ProcessIdentity.of(pid)
        self.note(check=None if who is None else [who.pid, who.started_at])


@contextlib.contextmanager
def holding(root: Path) -> Iterator[Journal]:
    """The merge lock and a fresh journal for one `stella merge`, an earlier killed one repaired first;
    StellaError (exit 2) while another stella merge runs in this repository."""
    repair(root)
    lock_path, journal_path = _paths(root)
    fd = _take(lock_path)
    if fd is None:
        raise StellaError(
            "another stella merge is running in this repository: wait for it to end", exit_code=EXIT_USAGE
        )
    try:
        journal = Journal(journal_path)
        journal.note()
        try:
            yield journal
        except BaseException:  # an error or Ctrl-C mid-step: settle what it left at once, as a repair would
            with contextlib.suppress(GitError, StellaError, OSError):
                _finish(root, journal.data, journal_path.stat().st_mtime)
                journal_path.unlink(missing_ok=True)
            raise
        journal_path.unlink(missing_ok=True)
    finally:
        _release(fd)


def repair(root: Path) -> str | None:
    """Finish what a killed `stella merge` left (see the module's doc); what was done, in one line, or None
    when there is no journal or its merge is still running."""
    lock_path, journal_path = _paths(root)
    if not journal_path.is_file():
        return None
    fd = _take(lock_path)
    if fd is None:
        return None  # the merge is alive (or another command is repairing it right now)
    try:
        try:
            data = json.loads(journal_path.read_text())
            journal_at: float | None = journal_path.stat().st_mtime
        except (OSError, ValueError):
            data, journal_at = {}, None
        said = _finish(root, data, journal_at)
        journal_path.unlink(missing_ok=True)
        for tmp in journal_path.parent.glob(f"{journal_path.name}.*.tmp"):  # one killed mid-write
            tmp.unlink(missing_ok=True)
        line = f"stella: a killed stella merge (pid {data.get('pid', '?')}) was finished: {said}"
    except GitError as exc:
        line = (
            f"stella: a killed stella merge (pid {data.get('pid', '?')}) is not finished yet: "
            f"{exc.message} (its journal stays at {journal_path})"
        )
    finally:
        _release(fd)
    print(line, file=sys.stderr)
    return line


def _stop_check(data: dict[str, Any]) -> str | None:
    check = data.get("check")
    if not check:
        return None
    who = ProcessIdentity(int(check[0]), float(check[1]))
    if not who.is_alive():
        return None
    stop_group(who.pid, CHECK_STOP_GRACE_S)  # the check ran in its own session: its group is its pid
    return f"its check (pid {who.pid}) stopped"


def _drop_index_lock(root: Path, journal_at: float | None) -> str | None:
    """Remove git's index.lock when the killed merge's own git left it: the journal was last written as
    the branch was about to move (the landing step), the lock is younger than that, the merge is dead
    (its lock is ours) and no git process that started before the lock runs in the repository. Such a
    lock stops every git command that writes the index, the user's too, and would stop finishing the
    landing. A lock that may be a live git's is left: GitError, said in one line."""
    lock = gitops.git_path(root, "--git-path", "index.lock")
    try:
        made = lock.stat().st_mtime
    except FileNotFoundError:
        return None
    shown = os.path.relpath(lock, root)
    if journal_at is None or made < journal_at - LOCK_CLOCK_SLACK_S:
        raise GitError(
            f"{shown} is older than the killed merge's last step, so it may be another git's: if no git "
            "command is running in this repository, remove it and run any stella command again"
        )
    # Only a git that started before the lock was made can hold it (a later one found it taken); start
    # times are known to a clock tick, so one that close counts too.
    running = gitops.git_processes_in(root, started_before=made + PROCESS_CLOCK_TICK_S)
    if running:
        raise GitError(
            f"{shown} is there and a git process runs in this repository (pid {running[0].pid}): left "
            "alone; run any stella command again once it has ended to finish the merge"
        )
    lock.unlink(missing_ok=True)
    return f"removed the {shown} its killed git left"


def _finish(root: Path, data: dict[str, Any], journal_at: float | None = None) -> str:
    done = [said] if (said := _stop_check(data)) else []
    landing = data.get("landing")
    status, after, reason = (
        MergeStatus.ERROR,
        None,
        "stella merge was stopped before this branch landed (killed or interrupted)",
    )
    if landing:
        onto, old, new = landing["onto"], landing["old"], landing["new"]
        if (said := _drop_index_lock(root, journal_at)) is not None:
            done.append(said)
        if mergeops.finish_advance(root, onto, old, new):
            done.append(f"{onto} at {new[:12]} got its index and files")
            if mergeops.contains(root, new, data.get("head") or new):
                status, after = MergeStatus.MERGED, new
                reason = f"landed on {onto} at {new[:12]} (finished after stella merge was killed)"
    merge_id, resolving = data.get("merge_id"), data.get("resolving")
    if merge_id is not None or resolving:
        with Ledger.open(StatePaths(root).fleet_db) as ledger:
            if resolving:  # its worker first: it may still write in the worktree that goes
                done.append(killedresolve.finish(root, ledger, resolving))
            if merge_id is not None:
                ledger.merges.finish(int(merge_id), status, after_sha=after, reason=reason)
                done.append(f"{data.get('branch') or 'its branch'} recorded {status}")
    worktree, scratch = data.get("worktree"), data.get("scratch")
    if worktree:
        with contextlib.suppress(GitError):
            worktrees.worktree_remove(root, Path(worktree), force=True)
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
        done.append("its scratch worktree removed")
    return "; ".join(done) or "nothing was left to do"
