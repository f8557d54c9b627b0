"""Salvage: what an unsuccessful attempt left uncommitted, kept (a remote attempt's on its node). A resumed
run's task starts from its salvage: with --from-salvage an isolated task's worktree, and a shared task's
claimed files when they still hold what its failed attempt left."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git.salvage import latest_salvage, still_in_tree
from stellafleet.run.resume import Resume
from stellafleet.run.salvaging import salvage_attempt
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.run.steps.claims import covered
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


def start_points(root: Path, resume: Resume) -> dict[str, str]:
    """--from-salvage: each resumed isolated task's latest salvage commit, by task id."""
    left = [t.id for t in resume.plan.tasks if t.isolation == "isolated" and t.id not in resume.done]
    latest = {task_id: latest_salvage(root, resume.run_id, task_id) for task_id in left}
    return {task_id: found.sha for task_id, found in latest.items() if found is not None}


def leftovers(root: Path, resume: Resume, changed: Sequence[str]) -> tuple[set[str], list[str]]:
    """Of the changed files an unfinished shared task claims, those its failed attempt left as its salvage
    commit holds them (they are the task's starting state, not the user's), and a note per attempt."""
    left: set[str] = set()
    notes = []
    for task in sorted(resume.plan.tasks, key=lambda task: task.id):
        claimed = [path for path in changed if covered(path, task.claims)]
        if not claimed or task.isolation == "isolated" or task.id in resume.done:
            continue
        saved = latest_salvage(root, resume.run_id, task.id)
        found = still_in_tree(root, saved.sha, claimed) if saved else []
        if saved is not None and found:
            left.update(found)
            notes.append(
                f"{', '.join(found)}: left by task {task.id}'s attempt {saved.parts[2]} (salvaged as "
                f"{saved.ref}); the task starts from {'it' if len(found) == 1 else 'them'}"
            )
    return left, notes


class Salvage(AttemptStep):
    def __init__(self, ledger: Ledger, claims: ClaimStore) -> None:
        self.ledger = ledger
        self.claims = claims

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """Its worktree, or its claimed paths of the shared tree."""
        if end.outcome == AttemptOutcome.SUCCEEDED or attempt.remote:
            return end
        ctx, workspace = attempt.ctx, attempt.workspace
        claimed = [] if workspace.isolated else self.claims.paths_of_attempt(ctx.run_id, ctx.attempt_id)
        salvage_attempt(
            self.ledger,
            root=ctx.root,
            run_id=ctx.run_id,
            task_id=ctx.task_id,
            attempt_id=ctx.attempt_id,
            worktree=workspace.path if workspace.isolated else None,
            claimed=claimed,
            outcome=str(end.outcome),
        )
        return end
