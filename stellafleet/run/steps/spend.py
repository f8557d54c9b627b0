"""The spend guard: each worker's share of the run's spend limit, held while it runs (core/spend.py)."""

from __future__ import annotations

from stellafleet.core.config import Config
from stellafleet.core.spend import NoBudget, SpendBudget, settle_attempt, task_guard
from stellafleet.core.status import AttemptEnd, Stop, StopReason
from stellafleet.pipelines.command import reported_usd
from stellafleet.run.events import SkipTask
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.state.ledger import Ledger


def spend_budget(
    limit: float | None, concurrency: int, config: Config, *, spent: float = 0.0
) -> SpendBudget | None:
    """A run's spend limit as its workers' guards, less what the run has spent (None: no limit)."""
    if limit is None:
        return None
    return SpendBudget(limit, concurrency, min_guard=config.governor.min_guard_usd, spent=spent)


class SpendGuard(AttemptStep):
    def __init__(self, ledger: Ledger, budget: SpendBudget | None, fleet_guard: float | None) -> None:
        self.ledger = ledger
        self.budget = budget  # under a spend limit: each worker's guard (fleet_guard otherwise)
        self.fleet_guard = fleet_guard

    def admit(self, attempt: AttemptState) -> None:
        """The worker's guard, at most the task's max_spend; SkipTask when the budget has too little left."""
        guard = self.fleet_guard
        if self.budget is not None:
            try:
                guard = self.budget.reserve(attempt.task.id)
            except NoBudget as exc:
                raise SkipTask(Stop(StopReason.SPEND_LIMIT, str(exc))) from None
        attempt.guard = task_guard(guard, attempt.task.max_spend)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """What the worker reported spending counts, even if it was stopped before it recorded it."""
        ctx = attempt.ctx
        settle_attempt(self.ledger.spend, ctx.attempt_id, (end.claimed_usd, reported_usd(ctx)))
        return end

    def released(self, attempt: AttemptState) -> None:
        """The guard is free again, and what the worker spent counts."""
        if self.budget is not None:
            self.budget.release(attempt.task.id, attempt.spend)
