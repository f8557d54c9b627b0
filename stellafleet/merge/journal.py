"""stella merge's journal record: what a running merge holds outside the ledger, so that a killed one is
finished by the next stella command (docs/merge.md).

One merge runs per repository. The record spans the one step git cannot do atomically: the branch ref
moves, then the index and the files follow.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from stellafleet.core.errors import EXIT_USAGE, GitError, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import MergeStatus
from stellafleet.git import gitops, mergeops, worktrees
from stellafleet.merge import killedresolve
from stellafleet.proc.group import stop_group
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

RECORD = "merge"
CHECK_STOP_GRACE_S = 2.0
LOCK_CLOCK_SLACK_S = 2.0  # file times may be coarse: a lock made just after the record may look older
PROCESS_CLOCK_TICK_S = 0.05  # a process's start time is known to a clock tick (and boot-time rounding)


class Journal:
    """The running merge's record; every change is written before the step it covers."""

    def __init__(self, root: Path | None) -> None:
        self.root = root  # None: a dry run's, which writes nothing
        self.data: dict[str, Any] = {}

    def note(self, **fields: Any) -> None:
        self.data.update(fields)
        if self.root is not None:
            journal.owner(self.root).write(RECORD, "merge", **self.data)

    def check_started(self, pid: int) -> None:
        who = ProcessIdentity.of(pid)
        self.note(check=None if who is None else [who.pid, who.started_at])


@contextlib.contextmanager
def holding(root: Path) -> Iterator[Journal]:
    """The merge's record for one `stella merge`; StellaError (exit 2) while another stella merge runs
    in this repository (or a killed one is not finished yet)."""
    owner = journal.owner(root)
    try:
        owner.write(RECORD, "merge", exclusive=True)
    except journal.Busy:
        raise StellaError(
            "another stella merge is running in this repository (or a killed one is not finished yet, as "
            "said above): wait for it to end",
            exit_code=EXIT_USAGE,
        ) from None
    merge = Journal(root)
    try:
        yield merge
    except BaseException:  # an error or Ctrl-C mid-step: settle what it left at once, as a repair would
        with contextlib.suppress(GitError, StellaError, OSError):
            _finish(root, merge.data, StatePaths(root).merge_journal.stat().st_mtime)
            owner.drop(RECORD)
        raise
    owner.drop(RECORD)


def repair(root: Path, records: Sequence[journal.Record]) -> bool:
    """Finish what a killed `stella merge` left, said in one line; False when it cannot be finished yet
    (the record stays for the next command)."""
    done = True
    for record in records:
        data, pid = record.data, record.data.get("pid", "?")
        try:
            said = _finish(root, data, record.written_at)
            line = f"stella: a killed stella merge (pid {pid}) was finished: {said}"
        except GitError as exc:
            line = (
                f"stella: a killed stella merge (pid {pid}) is not finished yet: "
                f"{exc.message} (its journal stays at {record.path})"
            )
            done = False
        print(line, file=sys.stderr)
    return done


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
    """Remove git's index.lock when the killed merge's own git provably left it: the lock is younger than
    the landing step's record and no git that started before it runs. Else GitError: it may be live."""
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
    # only a git started before the lock was made can hold it (start times are known to a clock tick)
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
