"""What earlier runs took, for `stella fleet --estimate` and the eager schedule: finished attempts' spend
and duration, found by the same task or by the same pipeline and model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stellafleet.core.status import AttemptOutcome
from stellafleet.state.sqlitefile import Table

# Attempts that ran to an end of their own: what a task costs when it runs (not a stop or a kill).
ENDED = (str(AttemptOutcome.SUCCEEDED), str(AttemptOutcome.FAILED))
# The same task in an earlier run: the same id and prompt, run by the same pipeline (the attempt's, else
# the task's own, else its run's).
PIPELINE = "coalesce(a.pipeline, t.pipeline, r.pipeline)"
SAME_TASK = f"a.task_id, t.prompt, {PIPELINE}"
_FROM = (
    " attempts a JOIN tasks t ON t.run_id = a.run_id AND t.id = a.task_id JOIN runs r ON r.id = a.run_id"
    " WHERE a.finished_at_ms IS NOT NULL"
)
_ATTEMPTS = f"SELECT a.spend_usd, a.finished_at_ms - a.started_at_ms FROM {_FROM} AND a.outcome IN (?, ?)"
# how far back past_durations looks: the same plan run again, or resumed, is among the last few runs
PAST_RUNS = 20


@dataclass(frozen=True)
class Past:
    """One earlier attempt: what it spent and how long it took."""

    usd: float
    seconds: float


class History(Table):
    """Reads of the attempts table for estimates."""

    def _past(self, where: str, params: tuple[object, ...]) -> list[Past]:
        rows = self._db.read(f"{_ATTEMPTS} AND {where} ORDER BY a.id", (*ENDED, *params))
        return [Past(float(usd), max(int(ms), 0) / 1000) for usd, ms in rows]

    def same_task(self, task_id: str, prompt: str, pipeline: str) -> list[Past]:
        """Earlier attempts of the same task (SAME_TASK), succeeded or failed, in any run."""
        return self._past(f"({SAME_TASK}) = (?, ?, ?)", (task_id, prompt, pipeline))

    def same_kind(self, pipeline: str, model: str | None) -> list[Past]:
        """Earlier attempts of any task with the same pipeline and model (`NULL`: the pipeline's default)."""
        return self._past(f"{PIPELINE} = ? AND t.model IS ?", (pipeline, model))

    def past_durations(self, tasks: Iterable[tuple[str, str | None, str]]) -> dict[str, float]:
        """Task id -> seconds its latest succeeded attempt as the same task took in the last PAST_RUNS
        runs, for tasks given as (id, prompt, pipeline); tasks never seen are left out."""
        wanted = {(task_id, prompt, pipeline) for task_id, prompt, pipeline in tasks}
        rows = self._db.read(
            f"SELECT {SAME_TASK}, a.finished_at_ms - a.started_at_ms FROM {_FROM} AND a.outcome = ?"
            " AND r.id IN (SELECT id FROM runs ORDER BY created_at_ms DESC, id DESC LIMIT ?) ORDER BY a.id",
            (str(AttemptOutcome.SUCCEEDED), PAST_RUNS),
        )
        found: dict[str, float] = {}
        for task_id, prompt, pipeline, elapsed_ms in rows:  # oldest first: the latest one stays
            if (task_id, prompt, pipeline) in wanted:
                found[task_id] = max(int(elapsed_ms), 0) / 1000
        return found
