"""Claims: a task's declared paths held for its attempt (state/claims.py), by its worker once it runs.
Before the run: a claimed path with unresolved merge conflicts, or with the user's uncommitted changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.words import files_named
from stellafleet.git import gitops
from stellafleet.git.salvage import leftovers, leftovers_said
from stellafleet.plan.model import Plan
from stellafleet.run.executor import Execution
from stellafleet.run.steps import AttemptState, AttemptStep, BeforeRun, Preflight, Workspace
from stellafleet.state.claims import ClaimStore, Holder


def covered(path: str, claims: Iterable[str]) -> bool:
    """Whether one of claims is path or a folder holding it."""
    return any(path == claim or path.startswith(claim.rstrip("/") + "/") for claim in claims)


def claim_keys(root: Path, workspace: Workspace, claims: Sequence[str]) -> list[str]:
    """The claim-store keys of a task's claims: they name files of its own workspace, so an isolated
    task's `x.txt` is its worktree's file and never collides with the shared tree's `x.txt`."""
    if not workspace.isolated:
        return list(claims)
    prefix = workspace.path.relative_to(root).as_posix()
    return [f"{prefix}/{claim}" for claim in claims]


def merge_state(root: Path, plan: Plan) -> tuple[list[str], list[str]]:
    """(warnings, problems) of a repository with an unresolved merge (a conflicted claim is a problem)."""
    merging, conflicted = gitops.unresolved_merge(root)
    if not merging and not conflicted:
        return [], []
    listed = ", ".join(conflicted[:5]) + (f" and {len(conflicted) - 5} more" if len(conflicted) > 5 else "")
    what = "an unfinished merge (MERGE_HEAD)" if merging else "unresolved conflicts"
    paths = f" with unresolved conflicts in {listed}" if conflicted else ""
    warnings = [
        f"the repository is in {what}{paths}: shared-tree tasks work and commit in the middle of it; "
        "finish it (`git merge --continue`) or abort it (`git merge --abort`) first"
    ]
    problems = [
        f"task {task.id!r} claims {path!r}, which has unresolved merge conflicts: resolve it "
        "(or run the task isolated) first"
        for task in plan.tasks
        if task.isolation != "isolated"
        for path in task.claims
        if path in conflicted
    ]
    return warnings, problems


def dirty_refusal(root: Path, dirty: Sequence[tuple[str, str]]) -> str:
    """Why a run refuses claimed files with uncommitted changes: the user's, or a failed task's leftovers."""
    left = leftovers(root, [path for path, _ in dirty])
    yours = ", ".join(f"{path} (task {owner})" for path, owner in dirty if path not in left)
    said = []
    if yours:
        said.append(
            f"claimed files have uncommitted changes of yours: {yours}; commit or stash them first, or "
            "pass --allow-dirty (the workers' commits of them then leave your changes out)"
        )
    if left:
        said.append(
            f"claimed files hold a failed task's leftovers, not changes of yours ({leftovers_said(left)}): "
            "`stella restore` puts them back to HEAD, or `stella fleet --resume RUN` starts from them"
        )
    return "; ".join(said)


class Claims(AttemptStep):
    def __init__(self, store: ClaimStore, root: Path) -> None:
        self.store = store
        self.root = root

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """An unresolved merge; the user's changes in claimed files (refused unless --allow-dirty), and
        the user's other changes, which the workers' commits leave out."""
        warnings, problems = merge_state(before.root, before.plan)
        shared = [task for task in before.plan.tasks if task.isolation != "isolated"]
        dirty = [
            (path, owner.id)
            for path in before.changed
            if (owner := next((task for task in shared if covered(path, task.claims)), None))
        ]
        if dirty and not before.allow_dirty:
            return Preflight(
                problems=tuple(problems), refusal=dirty_refusal(before.root, dirty), warnings=tuple(warnings)
            )
        notes = []
        if dirty:
            named = ", ".join(path for path, _ in dirty)
            warnings.append(
                f"--allow-dirty: {named} {'has' if len(dirty) == 1 else 'have'} uncommitted changes of "
                "yours; the workers' commits take only what the workers write, and your changes stay "
                "uncommitted"
            )
        elif before.changed:
            notes.append(
                f"your work tree has uncommitted changes ({files_named(list(before.changed))}): they stay "
                "yours, workers' commits leave them out"
            )
        return Preflight(problems=tuple(problems), warnings=tuple(warnings), notes=tuple(notes))

    def before_start(self, attempt: AttemptState) -> None:
        """ClaimConflict when a live holder has one of them."""
        task, ctx = attempt.task, attempt.ctx
        if task.claims:
            holder = Holder.current(ctx.run_id, task.id, task.title, ctx.attempt_id)
            self.store.acquire(claim_keys(self.root, attempt.workspace, task.claims), holder)

    def started(self, attempt: AttemptState, execution: Execution) -> None:
        """The worker holds them from now on (they outlive a killed fleet with it)."""
        ctx = attempt.ctx
        if not attempt.task.claims or execution.pid is None:
            return
        with contextlib.suppress(StellaError):  # a worker that already ended: the fleet keeps holding them
            worker = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id, execution.pid)
            self.store.hand_over(ctx.run_id, ctx.attempt_id, worker)

    def released(self, attempt: AttemptState) -> None:
        if attempt.context is not None:
            self.store.release_attempt_if_held(attempt.ctx.run_id, attempt.ctx.attempt_id)
