"""The provider-limit gate: each ended attempt told to the Limiter; a task a limit ended asks for another
attempt once the limit is over."""

from __future__ import annotations

from stellafleet.core.limits import LimitKind, kind_of
from stellafleet.core.status import FollowUpReason
from stellafleet.run.events import SkipTask
from stellafleet.run.limiter import Limiter
from stellafleet.run.steps import AttemptState, AttemptStep, FollowUp

# how many times a task whose CLI gave up on a rate limit runs again after the hold
RATE_RERUNS = 2


class LimitGate(AttemptStep):
    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def released(self, attempt: AttemptState) -> FollowUp | None:
        """A usage limit: again after its reset under --wait-for-limits, else skip the task (SkipTask); a
        CLI that gave up on a rate limit: again once the hold is over (at most RATE_RERUNS times)."""
        end = attempt.recorded
        if end is None:  # never recorded: nothing to tell
            return None
        ctx = attempt.ctx
        rows = self.limiter.attempt_ended(ctx.attempt_id)
        if not rows or end.reason is None:
            return None
        usage = next((row for row in rows if row["kind"] == LimitKind.USAGE), None)
        if usage is not None:
            if self.limiter.wait_for_reset(usage):
                return FollowUp(FollowUpReason.LIMIT, not_before_ms=usage.get("reset_at_ms"))
            raise SkipTask(self.limiter.usage_stop(usage))
        reruns = self.limiter.ledger.requests.count(ctx.run_id, ctx.task_id, FollowUpReason.LIMIT)
        if kind_of(None, None, end.reason) is None or reruns >= RATE_RERUNS:
            return None
        self.limiter.wait_out_hold()
        return FollowUp(FollowUpReason.LIMIT)
