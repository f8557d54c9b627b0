"""Expansions: what an expanding task emitted, checked and recorded before it counts as succeeded."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd
from stellafleet.run.expand import Expansions
from stellafleet.run.steps import AttemptState, AttemptStep


class Expand(AttemptStep):
    def __init__(self, expansions: Expansions) -> None:
        self.expansions = expansions

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        if end.reason is not None:
            return end
        return self.expansions.settle(attempt.task, attempt.ctx.plan_out, end)
