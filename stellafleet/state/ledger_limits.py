"""The ledger's `limit_events` table: the provider limits a run's workers met, and the fleet's width."""

from __future__ import annotations

from typing import Any

from stellafleet.core.limits import LimitEvent, LimitKind
from stellafleet.state.sqlitefile import Table


class Limits(Table):
    """The limit_events table: one row per limit a worker met, and per change of the fleet's width."""

    def add(
        self,
        run_id: str,
        event: LimitEvent,
        *,
        attempt_id: int | None = None,
        task_id: str | None = None,
        concurrency: int | None = None,
    ) -> int:
        """One limit row (an attempt's, or the fleet's own with its width); its id."""
        said = (event.source, str(event.kind), event.status, event.reset_at_ms, event.message)
        return self._db.insert(
            "INSERT INTO limit_events (run_id, attempt_id, task_id, at_ms, source, kind, status,"
            " reset_at_ms, message, concurrency) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, attempt_id, task_id, self._db.now_ms(), *said, concurrency),
        )

    def of_attempt(self, attempt_id: int) -> list[dict[str, Any]]:
        return self._db.rows("SELECT * FROM limit_events WHERE attempt_id = ? ORDER BY id", (attempt_id,))

    def after(self, run_id: str, after_id: int) -> list[dict[str, Any]]:
        """The run's limit rows its workers wrote past row id after_id (the fleet's own rows left out)."""
        return self._db.rows(
            "SELECT * FROM limit_events WHERE run_id = ? AND id > ? AND kind != ? ORDER BY id",
            (run_id, after_id, str(LimitKind.CONCURRENCY)),
        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        """Every limit row of the run, the fleet's width changes included, oldest first."""
        return self._db.rows("SELECT * FROM limit_events WHERE run_id = ? ORDER BY id", (run_id,))

    def latest_rate_reset_ms(self, run_id: str) -> int | None:
        """The furthest reset of the run's rate limits (epoch ms; None: none reported)."""
        rows = self._db.read(
            "SELECT max(reset_at_ms) FROM limit_events WHERE run_id = ? AND kind = ?",
            (run_id, str(LimitKind.RATE)),
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else None
