"""What earlier runs took, for `stella fleet --estimate`: finished attempts' spend and duration, found by
the same task (id, prompt and pipeline) or by the same pipeline and model."""

from __future__ import annotations

from dataclasses import dataclass

from stellafleet.core.status import AttemptOutcome
from stellafleet.state.sqlitefile import Database

# Attempts that ran to an end of their own: what a task costs when it runs (not a stop or a kill).
ENDED = (str(AttemptOutcome.SUCCEEDED), str(AttemptOutcome.FAILED))
_ATTEMPTS = (
    "SELECT a.spend_usd, a.finished_at_ms - a.started_at_ms FROM attempts a"
    " JOIN tasks t ON t.run_id = a.run_id AND t.id = a.task_id JOIN runs r ON r.id = a.run_id"
    " WHERE a.finished_at_ms IS NOT NULL AND a.outcome IN (?, ?)"
)


@dataclass(frozen=True)
class Past:
    """One earlier attempt: what it spent and how long it took."""

    usd: float
    seconds: float


class History:
    """Reads of the attempts table for estimates."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _past(self, where: str, params: tuple[object, ...]) -> list[Past]:
        rows = self._db.read(f"{_ATTEMPTS} AND {where} ORDER BY a.id", (*ENDED, *params))
        return [Past(float(usd), max(int(ms), 0) / 1000) for usd, ms in rows]

    def same_task(self, task_id: str, prompt: str, pipeline: str) -> list[Past]:
        """Earlier attempts of the same task: its id, prompt and pipeline (the task's own, else its run's)."""
        return self._past(
            "a.task_id = ? AND t.prompt = ? AND coalesce(t.pipeline, r.pipeline) = ?",
            (task_id, prompt, pipeline),
        )

    def same_kind(self, pipeline: str, model: str | None) -> list[Past]:
        """Earlier attempts of any task with the same pipeline and model (`NULL`: the pipeline's default)."""
        return self._past("coalesce(t.pipeline, r.pipeline) = ? AND t.model IS ?", (pipeline, model))
