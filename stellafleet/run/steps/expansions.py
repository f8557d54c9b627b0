"""Expansions: what an expanding task emitted, checked and recorded before it counts as succeeded. An
isolated expanding task cannot run on a Ray node: its fragment would stay there."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd
from stellafleet.run.expand import Expansions
from stellafleet.run.steps import AttemptState, AttemptStep, BeforeRun, Preflight


class Expand(AttemptStep):
    def __init__(self, expansions: Expansions) -> None:
        self.expansions = expansions

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """On a Ray cluster, an isolated expanding task is a problem."""
        if not before.remote:
            return Preflight()
        return Preflight(
            tuple(
                f"task {task.id!r}: expands = true needs the task to run on this machine, and isolated tasks "
                'run on the Ray cluster: make it shared, or run without [executor] kind = "ray"'
                for task in before.plan.tasks
                if task.expands and task.isolation == "isolated"
            )
        )

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        if end.reason is not None:
            return end
        return self.expansions.settle(attempt.task, attempt.ctx.plan_out, end)
