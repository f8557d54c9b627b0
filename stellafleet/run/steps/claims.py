"""Claims: a task's declared paths held for its attempt (state/claims.py), by its worker once it runs."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.run.executor import Execution
from stellafleet.run.steps import AttemptState, AttemptStep, Workspace
from stellafleet.state.claims import ClaimStore, Holder


def claim_keys(root: Path, workspace: Workspace, claims: Sequence[str]) -> list[str]:
    """The claim-store keys of a task's claims: they name files of its own workspace, so an isolated
    task's `x.txt` is its worktree's file and never collides with the shared tree's `x.txt`."""
    if not workspace.isolated:
        return list(claims)
    prefix = workspace.path.relative_to(root).as_posix()
    return [f"{prefix}/{claim}" for claim in claims]


class Claims(AttemptStep):
    def __init__(self, store: ClaimStore, root: Path) -> None:
        self.store = store
        self.root = root

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
