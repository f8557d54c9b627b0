"""stella merge's journal record (one merge per repository) and the repair of a killed merge or resolve task
(docs/merge.md); it spans what git cannot do atomically: the branch ref moves, then the index and files."""

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
from stellafleet.core.status import AttemptEnd, AttemptOutcome, MergeStatus, TaskStatus
from stellafleet.git import gitops, mergeops, worktrees
from stellafleet.git.clean import uncommitted
from stellafleet.proc.group import group_exists, stop_group
from stellafleet.proc.pids import pid_alive
from stellafleet.run.salvaging import salvage_attempt
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

RECORD = "merge"
STOPPED = "stella merge was stopped before this branch landed (killed or interrupted)"
STOP_GRACE_S = 2.0  # for a killed merge's resolve worker
LOCK_CLOCK_SLACK_S = 2.0  # file times may be coarse: a lock made just after the record may look older


class Journal:
    """The running merge's record; every change is written before the step it covers."""

    def __init__(self, root: Path | None) -> None:
        self.root = root  # None: a dry run's, which writes nothing
        self.data: dict[str, Any] = {}

    def note(self, **fields: Any) -> None:
        self.data.update(fields)
        if self.root is not None:
            journal.owner(self.root).write(RECORD, "merge", **self.data)


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
    # only a git started before the lock was made can hold it
    running = gitops.git_processes_in(root, started_before=made)
    if running:
        raise GitError(
            f"{shown} is there and a git process runs in this repository (pid {running[0].pid}): left "
            "alone; run any stella command again once it has ended to finish the merge"
        )
    lock.unlink(missing_ok=True)
    return f"removed the {shown} its killed git left"


def _finish(root: Path, data: dict[str, Any], journal_at: float | None = None) -> str:
    done: list[str] = []  # its check, if any, is stopped by its own record (run/checking.py)
    landing = data.get("landing")
    after, reason = None, STOPPED
    if landing:
        onto, old, new = landing["onto"], landing["old"], landing["new"]
        if (said := _drop_index_lock(root, journal_at)) is not None:
            done.append(said)
        if mergeops.finish_advance(root, onto, old, new):
            done.append(f"{onto} at {new[:12]} got its index and files")
            after = new
            reason = f"landed on {onto} at {new[:12]} (finished after stella merge was killed)"
    members = [(data["merge_id"], data.get("branch"), data.get("head"))] if data.get("merge_id") else []
    members += [tuple(member) for member in data.get("members") or []]  # a batch's not settled yet
    resolving, fixing = data.get("resolving"), data.get("fixing")
    batch_id = data.get("batch_id")
    if members or resolving or batch_id or fixing:
        with Ledger.open(StatePaths(root).fleet_db) as ledger:
            if resolving:  # its worker first: it may still write in the worktree that goes
                done.append(_finish_resolve(root, ledger, resolving))
            if fixing:
                done.append(_finish_fix(root, ledger, fixing))
            for merge_id, branch, head in members:
                landed = after is not None and mergeops.contains(root, after, head or after)
                status = MergeStatus.MERGED if landed else MergeStatus.ERROR
                ledger.merges.finish(int(merge_id), status, after_sha=after if landed else None,
                                     reason=reason if landed else STOPPED)  # fmt: skip
                done.append(f"{branch or 'its branch'} recorded {status}")
            if batch_id:
                ledger.merge_batches.interrupted(int(batch_id))
    worktree, scratch = data.get("worktree"), data.get("scratch")
    if worktree:
        with contextlib.suppress(GitError):
            worktrees.worktree_remove(root, Path(worktree), force=True)
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
        done.append("its scratch worktree removed")
    return "; ".join(done) or "nothing was left to do"


RESOLVE_REASON = "stella merge --resolve was killed while this resolve task ran: its attempt was abandoned"
FIX_REASON = "stella merge --fix was killed while this task's fix ran: its attempt was abandoned"


def _stop_worker(attempt: dict[str, Any]) -> bool:
    """Stop the attempt's worker and whatever is left in its process group (a worker runs in a session of
    its own: its group is its pid); whether anything was running."""
    pid = attempt.get("pid")
    if pid is None:
        return False
    # The leader gone (or a zombie) but its group still there: the worker's own children, which outlived
    # it (a new process given the pid since would lead a group of that pid: a live process at the pid).
    leftovers = group_exists(int(pid)) and not pid_alive(int(pid), None)
    if not (pid_alive(int(pid), attempt.get("pid_started_ms")) or leftovers):
        return False
    stop_group(int(pid), STOP_GRACE_S)
    return True


def _abandon(
    root: Path, ledger: Ledger, run_id: str, task_id: str, attempt: dict[str, Any], why: str = RESOLVE_REASON
) -> list[str]:
    done = [f"its worker (pid {attempt['pid']}) stopped"] if _stop_worker(attempt) else []
    attempt_id = int(attempt["id"])
    worktree = Path(attempt["worktree"]) if attempt.get("worktree") else None
    saved = salvage_attempt(
        ledger,
        root=root,
        run_id=run_id,
        task_id=task_id,
        attempt_id=attempt_id,
        worktree=worktree,
        outcome=str(AttemptOutcome.ABANDONED),
    )
    if saved is not None:
        attempt["salvage_sha"] = saved.sha
        done.append(f"its uncommitted work salvaged as {saved.ref}")
    ledger.attempts.finish(attempt_id, AttemptEnd(AttemptOutcome.ABANDONED, why, why))
    return done


def _drop_workspace(root: Path, attempt: dict[str, Any], tip: str | None) -> list[str]:
    """Remove the resolve task's worktree (unless it holds work no salvage kept) and its branch when it
    has nothing beyond tip."""
    done: list[str] = []
    path = Path(attempt["worktree"]) if attempt.get("worktree") else None
    if path is not None and path.is_dir():
        if uncommitted(path) and not attempt.get("salvage_sha"):
            return [f"its worktree {path} kept: it holds uncommitted work"]
        worktrees.worktree_remove(root, path, force=True)
        done.append("its worktree removed")
    gitops.git("worktree", "prune", cwd=root, check=False)
    branch = attempt.get("branch")
    if branch and tip and gitops.ref_commit(root, f"refs/heads/{branch}") == tip:
        gitops.branch_delete(root, branch)
        done.append(f"its empty branch {branch} deleted")
    return done


def _finish_fix(root: Path, ledger: Ledger, noted: dict[str, Any]) -> str:
    """The --fix attempt a killed merge noted: its worker stopped, its attempt abandoned (what it left
    uncommitted salvaged); the task's own worktree stays, as after any stopped attempt."""
    run_id, task_id = str(noted["run_id"]), str(noted["task_id"])
    columns = "id, task_id, outcome, pid, pid_started_ms, worktree, branch, salvage_sha"
    running = [
        a
        for a in ledger.attempts.of_run(run_id, columns)
        if a["task_id"] == task_id and a["outcome"] == AttemptOutcome.RUNNING
    ]
    done = [said for a in running for said in _abandon(root, ledger, run_id, task_id, a, FIX_REASON)]
    return f"its --fix attempt of task {task_id}: {', '.join(done) or 'had already ended'}"


def _finish_resolve(root: Path, ledger: Ledger, noted: dict[str, Any]) -> str:
    """Finish the resolve task a killed `stella merge --resolve` noted: its worker stopped, its work salvaged
    before the worktree goes (kept when it could not be); what was done, in words."""
    run_id, task_id, tip = str(noted["run_id"]), str(noted["task_id"]), noted.get("tip")
    columns = "id, task_id, outcome, pid, pid_started_ms, worktree, branch, salvage_sha"
    attempts = [a for a in ledger.attempts.of_run(run_id, columns) if a["task_id"] == task_id]
    done: list[str] = []
    for attempt in attempts:
        if attempt["outcome"] == AttemptOutcome.RUNNING:
            done += _abandon(root, ledger, run_id, task_id, attempt)
    task = next((t for t in ledger.get_run(run_id)["tasks"] if t["id"] == task_id), None)
    if task is not None and task["status"] in (TaskStatus.RUNNING, TaskStatus.PENDING, "abandoned"):
        ledger.tasks.set_status(run_id, task_id, TaskStatus.INTERRUPTED, RESOLVE_REASON)
        done.append("recorded interrupted")
    if attempts:
        try:
            done += _drop_workspace(root, attempts[-1], tip)
        except (GitError, StellaError, OSError) as exc:
            done.append(f"its worktree could not be removed ({exc}): `stella clean` removes it")
    return f"its resolve task {task_id}: {', '.join(done) or 'had already ended'}"
