"""The provider-limit gate: each ended attempt told to the Limiter; a task a limit ended runs again after."""

from __future__ import annotations

import threading

from stellafleet.core.limits import LimitKind, kind_of
from stellafleet.run.events import SkipTask
from stellafleet.run.limiter import Limiter
from stellafleet.run.steps import AttemptState, AttemptStep, RunAgain

# how many times a task whose CLI gave up on a rate limit runs again after the hold
RATE_RERUNS = 2


class LimitGate(AttemptStep):
    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self._lock = threading.Lock()
        self._reruns: dict[str, int] = {}  # task id -> attempts run again after a rate limit ended one

    def released(self, attempt: AttemptState) -> None:
        """A usage limit: run again after its reset under --wait-for-limits, else skip the task (SkipTask); a
        CLI that gave up on a rate limit: run again once the hold is over (at most RATE_RERUNS)."""
        end = attempt.recorded
        if end is None:  # never recorded: nothing to tell
            return
        rows = self.limiter.attempt_ended(attempt.ctx.attempt_id)
        if not rows or end.reason is None:
            return
        usage = next((row for row in rows if row["kind"] == LimitKind.USAGE), None)
        if usage is not None:
            if self.limiter.wait_for_reset(usage):
                raise RunAgain("limit")
            raise SkipTask(self.limiter.usage_stop(usage))
        task_id = attempt.task.id
        with self._lock:
            reruns = self._reruns.get(task_id, 0)
            if kind_of(None, None, end.reason) is None or reruns >= RATE_RERUNS:
                return
            self._reruns[task_id] = reruns + 1
        self.limiter.wait_out_hold()
        raise RunAgain("limit")
