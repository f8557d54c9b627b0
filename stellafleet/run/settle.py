"""Spend reported is spend recorded: after a worker ends, the fleet records what it reported spending
but the ledger does not hold yet.

A worker lands its spend in the ledger itself as it goes. When it is stopped or killed before it could
(a command wrote its spend to its result file, then the task's timeout stopped the worker before it read
the file), or its own recording failed, the dollars would be lost: the fleet reads what was reported (the
worker's result file, the command pipeline's result file) and records the difference.
"""

from __future__ import annotations

from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.command import reported_usd
from stellafleet.state.ledger import Ledger

# Below this the difference is float rounding in adding the same reports up twice, not lost money.
EPSILON_USD = 1e-9


def record_reported_spend(ledger: Ledger, ctx: WorkerContext, result: PipelineResult | None) -> float:
    """Record what ctx's attempt reported beyond what the ledger holds; returns the dollars added."""
    reported = max(result.spend_usd if result is not None else 0.0, reported_usd(ctx))
    missing = reported - ledger.spend.of_attempt(ctx.attempt_id)
    if missing <= EPSILON_USD:
        return 0.0
    ledger.spend.add(ctx.attempt_id, missing)
    return missing
