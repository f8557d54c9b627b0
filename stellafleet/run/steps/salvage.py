"""Salvage: what an unsuccessful attempt left uncommitted, kept (a remote attempt's on its node)."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.run.salvaging import salvage_attempt
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


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
