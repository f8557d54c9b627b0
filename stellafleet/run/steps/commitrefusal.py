"""A refused commit is the attempt's reason: a worker's `stella commit` that a commit hook refused leaves
its first line (the hook and its first error line) as an attempt fact (commands/commit.py); an attempt
whose worker then fails by itself fails with that line, not with its agent's last words."""

from __future__ import annotations

from dataclasses import replace

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git.hooks import REFUSED_FACT
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.state.ledger import Ledger


class CommitRefusal(AttemptStep):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        if end.outcome != AttemptOutcome.FAILED or end.stop is not None:
            return end  # it succeeded, or was stopped (a timeout, the run's stop): that is its reason
        refused = self.ledger.facts.of_attempt(attempt.ctx.attempt_id).get(REFUSED_FACT)
        return replace(end, error=str(refused)) if refused else end
