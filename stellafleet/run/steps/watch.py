"""The watchdog: a started worker watched for progress (run/watchdog.py); one it stopped ends `stalled`."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd
from stellafleet.run.executor import Execution
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.run.watchdog import Watchdog


class Watch(AttemptStep):
    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def started(self, attempt: AttemptState, execution: Execution) -> None:
        self.watchdog.watch(attempt.ctx, execution)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        stalled = self.watchdog.forget(attempt.ctx.attempt_id)
        return end.stalled(stalled) if stalled else end

    def released(self, attempt: AttemptState) -> None:
        if attempt.context is not None:  # its worker's wait failed: watched no more either
            self.watchdog.forget(attempt.ctx.attempt_id)
