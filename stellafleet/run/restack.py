"""A parent whose branch moved after its stacked tasks started (a --fix-ci round): every one of them is marked
stale (a `stale` request waiting on a person) before any moves, then each one's own commits are replayed onto
a start built from its parents as they are now, when that is free of conflicts, and its request dismissed;
one that would conflict is named, its branch is left as it was, and its request stays. The restack is a
journal record: a killed one is finished by the next command (`repair`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.errors import GitError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import FollowUpReason, RequestState
from stellafleet.git import gitops, mergeops, stack
from stellafleet.run.steps import AttemptFailed, RunSettings
from stellafleet.run.steps.startcommit import contributions
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

RECORD = "restack"


@dataclass(frozen=True)
class Move:
    """One task's branch on its way from old to new (its replayed work on start); what a repair finishes."""

    task_id: str
    attempt_id: int
    branch: str
    worktree: str | None
    old: str
    new: str
    start: str
    shown: tuple[tuple[str, str], ...]  # the parents' heads the new start holds


def restack_children(settings: RunSettings, ledger: Ledger, parent_id: str, old_tip: str) -> list[str]:
    """What became of each stacked task whose start held parent_id at old_tip, one note each."""
    record = ledger.get_run(settings.run_id)
    latest = {attempt["task_id"]: attempt for attempt in record["attempts"] if attempt.get("start_commit")}
    affected = []
    for task in record["tasks"]:
        attempt = latest.get(task["id"])
        if attempt is None or not task.get("branch"):
            continue
        held = {(p["task"], p["commit"]) for p in json.loads(attempt["start_parents_json"] or "[]")}
        if (parent_id, old_tip) in held:
            affected.append((task, attempt))
    return _restack_all(settings, ledger, parent_id, affected)


def _restack_all(
    settings: RunSettings,
    ledger: Ledger,
    parent_id: str,
    affected: list[tuple[dict[str, Any], dict[str, Any]]],
) -> list[str]:
    """Each affected (task, its attempt with the start) restacked in turn, under one journal record; all
    marked stale first, so that a restack killed on the way leaves none looking current."""
    if not affected:
        return []
    restack = _Journal(settings, parent_id, [str(task["id"]) for task, _ in affected])
    why = f"{parent_id} changed after it started"
    try:
        for task, _ in affected:
            _ask(ledger, settings.run_id, task, f"{task['id']} is stale ({why}): being restacked", why)
        return [_restack(settings, ledger, task, attempt, why, restack) for task, attempt in affected]
    finally:
        restack.done()


def _ask(ledger: Ledger, run_id: str, task: dict[str, Any], note: str, why: str) -> None:
    ledger.tasks.set_stale(run_id, str(task["id"]), why)
    ledger.requests.ask(
        run_id, str(task["id"]), FollowUpReason.STALE, note,
        asked_by="restack", branch=str(task["branch"]), state=RequestState.NEEDS_YOU,
    )  # fmt: skip


class _Journal:
    """The restack's record: the tasks still to restack and the move in flight, written before each step."""

    def __init__(self, settings: RunSettings, parent_id: str, pending: list[str]) -> None:
        self.owner = journal.owner(settings.root)
        self.name = f"{RECORD}-{self.owner.name}"
        self.data: dict[str, Any] = {"run_id": settings.run_id, "parent": parent_id, "pending": pending}
        self.note()

    def note(self, **fields: Any) -> None:
        self.data.update(fields)
        self.owner.write(self.name, RECORD, **self.data)

    def done(self) -> None:
        self.owner.drop(self.name)


def _restack(
    settings: RunSettings,
    ledger: Ledger,
    task: dict[str, Any],
    attempt: dict[str, Any],
    why: str,
    restack: _Journal,
) -> str:
    """The task's branch replayed onto its parents' work as it is now and recorded; or why it was left."""
    task_id = str(task["id"])
    planned = _planned(settings, ledger, task, attempt)
    failed = planned if isinstance(planned, str) else None
    if isinstance(planned, Move):
        restack.note(moving=asdict(planned))
        failed = _move(settings.root, ledger, settings.run_id, planned)
        parent, where = restack.data["parent"], f"{planned.branch} is at {planned.new[:12]}"
        note = f"restacked {task_id} onto {parent}'s new work: {where}"
    if failed is not None:  # its work no longer replays: a person decides
        note = f"{task_id} is stale ({why}) and its branch is left as it was: {failed}"
        _ask(ledger, settings.run_id, task, note, why)
    restack.note(moving=None, pending=[name for name in restack.data["pending"] if name != task_id])
    return note


def _planned(
    settings: RunSettings, ledger: Ledger, task: dict[str, Any], attempt: dict[str, Any]
) -> Move | str:
    """Where the task's branch goes: its own commits on a start built from its parents now; or why not."""
    root, task_id, branch = settings.root, str(task["id"]), str(task["branch"])
    try:
        parts = contributions(settings, ledger, task_id)
    except AttemptFailed as exc:  # a parent's branch is gone
        return str(exc)
    start = stack.build_start(root, settings.base_commit, parts)
    tip = gitops.ref_commit(root, f"refs/heads/{branch}")
    if isinstance(start, stack.Conflict) or tip is None:
        return str(start) if tip else "its branch is gone"
    own = tuple(commit.sha for commit in gitops.commits_between(root, str(attempt["start_commit"]), tip))
    moved = stack.build_start(root, start, [stack.Contribution(task_id, commits=own)])
    if isinstance(moved, stack.Conflict):
        return f"its own work would conflict with the new start on {', '.join(moved.paths)}"
    shown = tuple((part.task_id, part.head) for part in parts if part.head)
    worktree = str(task["worktree"]) if task.get("worktree") else None
    return Move(task_id, int(attempt["id"]), branch, worktree, tip, moved, start, shown)


def _move(root: Path, ledger: Ledger, run_id: str, move: Move) -> str | None:
    """Move the branch (and its checkout) from old to new and record it; why not (None: done)."""
    worktree = Path(move.worktree) if move.worktree else None
    try:
        if worktree is not None and worktree.is_dir():  # its checkout follows the branch
            mergeops.advance_branch(worktree, move.branch, move.new, move.old)
        else:
            gitops.git("update-ref", f"refs/heads/{move.branch}", move.new, move.old, cwd=root)
    except GitError as exc:
        return str(exc)
    _record(root, ledger, run_id, move)
    return None


def _record(root: Path, ledger: Ledger, run_id: str, move: Move) -> None:
    """The ledger's side of a move: the new start and its parents, the replayed commits, stale no more."""
    ledger.attempts.set_start(move.attempt_id, move.start, move.shown)
    replayed = gitops.commits_between(root, move.start, move.new)
    ledger.commits.record(
        replayed, run_id=run_id, task_id=move.task_id, attempt_id=move.attempt_id, branch=move.branch
    )
    ledger.tasks.set_stale(run_id, move.task_id, None)
    ledger.requests.dismiss(run_id, move.task_id, move.branch, FollowUpReason.STALE, "restacked")


def repair(root: Path, records: Sequence[journal.Record]) -> bool:
    """Finish what a killed restack left: the move in flight (its worktree and ledger), then the tasks it had
    not reached; each said in one line. What cannot be finished stays stale, waiting on a person."""
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        for record in records:
            said = _finish(root, ledger, record.data)
            print(f"stella: a killed restack (pid {record.data.get('pid', '?')}) was finished: {said}",
                  file=sys.stderr)  # fmt: skip
    return True


def _finish(root: Path, ledger: Ledger, data: dict[str, Any]) -> str:
    run_id, parent = str(data["run_id"]), str(data["parent"])
    notes, settled = [], set()  # the move in flight, finished or left
    if data.get("moving"):
        move = Move(**{**data["moving"], "shown": tuple(tuple(pair) for pair in data["moving"]["shown"])})
        now = gitops.ref_commit(root, f"refs/heads/{move.branch}")
        worktree = Path(move.worktree) if move.worktree else None
        if now == move.new:  # the branch moved; its checkout may not have
            if worktree is not None and worktree.is_dir():
                mergeops.finish_advance(worktree, move.branch, move.old, move.new)
            _record(root, ledger, run_id, move)
            settled.add(move.task_id)
            notes.append(f"restacked {move.task_id}: {move.branch} is at {move.new[:12]}")
        elif now != move.old:
            settled.add(move.task_id)
            notes.append(
                f"{move.task_id} stays stale: {move.branch} is at neither its old nor its new commit"
            )
    run = ledger.get_run(run_id)
    settings = RunSettings(root, run_id, str(run["run"]["base_commit"]), default_pipeline="")
    latest = {a["task_id"]: a for a in run["attempts"] if a.get("start_commit")}
    tasks = {str(task["id"]): task for task in run["tasks"]}
    # a task restacked just before the kill is restacked again: the same inputs give the same commits
    left = [
        (tasks[name], latest[name])
        for name in data.get("pending", ())
        if name not in settled and name in latest
    ]
    notes += _restack_all(settings, ledger, parent, left)
    return "; ".join(notes) or "nothing was left to do"
