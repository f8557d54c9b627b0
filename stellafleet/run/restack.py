"""A parent whose branch moved after its stacked tasks started (a --fix-ci round): each of them is marked
stale, then its own commits are replayed onto a start built from its parents as they are now, when
that is free of conflicts; one that would conflict is named, its branch is left as it was, and a `stale`
request waits on a person."""

from __future__ import annotations

import json
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.core.status import FollowUpReason, RequestState
from stellafleet.git import gitops, mergeops, stack
from stellafleet.run.steps import RunSettings
from stellafleet.run.steps.startcommit import contributions
from stellafleet.state.ledger import Ledger


def restack_children(settings: RunSettings, ledger: Ledger, parent_id: str, old_tip: str) -> list[str]:
    """What became of each stacked task whose start held parent_id at old_tip, one note each."""
    record = ledger.get_run(settings.run_id)
    latest = {attempt["task_id"]: attempt for attempt in record["attempts"] if attempt.get("start_commit")}
    notes = []
    for task in record["tasks"]:
        attempt = latest.get(task["id"])
        if attempt is None or not task.get("branch"):
            continue
        held = {(p["task"], p["commit"]) for p in json.loads(attempt["start_parents_json"] or "[]")}
        if (parent_id, old_tip) not in held:
            continue
        ledger.tasks.set_stale(settings.run_id, task["id"], f"{parent_id} changed after it started")
        note, replayed = _restack(settings, ledger, task, attempt, parent_id)
        notes.append(note)
        if not replayed:  # its work no longer replays: a person decides
            ledger.requests.ask(
                settings.run_id, task["id"], FollowUpReason.STALE, note,
                asked_by="restack", branch=str(task["branch"]), state=RequestState.NEEDS_YOU,
            )  # fmt: skip
    return notes


def _restack(
    settings: RunSettings, ledger: Ledger, task: dict[str, object], attempt: dict[str, object], parent_id: str
) -> tuple[str, bool]:
    """The task's branch replayed onto its parents' work as it is now, recorded (True); or why it was left."""
    root, task_id, branch = settings.root, str(task["id"]), str(task["branch"])
    left = f"{task_id} is stale ({parent_id} changed after it started) and its branch is left as it was"
    parts = contributions(settings, ledger, task_id)
    start = stack.build_start(root, settings.base_commit, parts)
    tip = gitops.ref_commit(root, f"refs/heads/{branch}")
    if isinstance(start, stack.Conflict) or tip is None:
        return f"{left}: {start if tip else 'its branch is gone'}", False
    own = tuple(commit.sha for commit in gitops.commits_between(root, str(attempt["start_commit"]), tip))
    moved = stack.build_start(root, start, [stack.Contribution(task_id, commits=own)])
    if isinstance(moved, stack.Conflict):
        return f"{left}: its own work would conflict with the new start on {', '.join(moved.paths)}", False
    worktree = Path(str(task["worktree"])) if task.get("worktree") else None
    try:
        if worktree is not None and worktree.is_dir():  # its checkout follows the branch
            mergeops.advance_branch(worktree, branch, moved, tip)
        else:
            gitops.git("update-ref", f"refs/heads/{branch}", moved, tip, cwd=root)
    except GitError as exc:
        return f"{left}: {exc}", False
    shown = [(part.task_id, part.head) for part in parts if part.head]
    attempt_id = int(str(attempt["id"]))
    ledger.attempts.set_start(attempt_id, start, shown)
    replayed = gitops.commits_between(root, start, moved)
    ledger.commits.record(
        replayed, run_id=settings.run_id, task_id=task_id, attempt_id=attempt_id, branch=branch
    )
    ledger.tasks.set_stale(settings.run_id, task_id, None)
    return f"restacked {task_id} onto {parent_id}'s new work: {branch} is at {moved[:12]}", True
