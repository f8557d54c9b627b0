"""The dashboard's extra ledger queries: spend over time, run sparklines, an attempt's recorded files.

Read-only and aggregated in SQLite, so a run with tens of thousands of spend events sends the page a few
hundred points, and the runs list one short row of numbers per run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stellafleet.state.ledger_reads import LedgerReads
from stellafleet.state.ledger_schema import LEDGER_SCHEMA
from stellafleet.state.sqlitefile import open_database


class DashboardReads(LedgerReads):
    """A read-only ledger connection with the dashboard's aggregate queries on top of LedgerReads."""

    @classmethod
    def open(cls, path: Path) -> DashboardReads:
        """Open the ledger at path read-only; StellaError if it is missing or not a ledger."""
        return cls(open_database(Path(path), LEDGER_SCHEMA, readonly=True), Path(path), readonly=True)

    def spend_buckets(
        self, run_id: str, *, start_ms: int, end_ms: int, points: int
    ) -> list[tuple[int, float]]:
        """The run's spend events summed into `points` equal time buckets over [start_ms, end_ms]:
        (time of the bucket's last event, dollars in the bucket), in time order; events outside the span
        fall into the first or last bucket, so the buckets always add up to every event."""
        span = max(1, end_ms - start_ms)
        rows = self._read(
            "SELECT min(?, max(0, (at_ms - ?) * ? / ?)) AS bucket, max(at_ms), sum(usd) FROM spend_events"
            " WHERE run_id = ? GROUP BY bucket ORDER BY bucket",
            (points - 1, start_ms, points, span, run_id),
        )
        return [(int(row[1]), float(row[2])) for row in rows]

    def spend_sparklines(
        self, spans: list[tuple[str, int, int]], *, points: int, now_ms: int
    ) -> dict[str, list[float]]:
        """Cumulative dollars per run at `points` equal steps over each (run id, start, end) span, each
        attempt's spend counted when it ended (still running: now). Built from the attempts, not the
        spend events: a list row's sparkline needs its shape, and a run has ten times fewer attempts."""
        lines: dict[str, list[float]] = {}
        for run_id, start_ms, end_ms in spans:
            rows = self._read(
                "SELECT min(?, max(0, (coalesce(finished_at_ms, ?) - ?) * ? / ?)) AS bucket, sum(spend_usd)"
                " FROM attempts WHERE run_id = ? AND spend_usd > 0 GROUP BY bucket",
                (points - 1, now_ms, start_ms, points, max(1, end_ms - start_ms), run_id),
            )
            buckets = [0.0] * points
            for bucket, usd in rows:
                buckets[int(bucket)] += float(usd)
            total, line = 0.0, []
            for usd in buckets:
                total += usd
                line.append(round(total, 6))
            lines[run_id] = line
        return lines

    def last_spend_ms_of(self, attempt_ids: list[int]) -> dict[int, int]:
        """attempt id -> time of its latest spend event, for the given attempts that have one."""
        if not attempt_ids:
            return {}
        rows = self._read(
            "SELECT attempt_id, max(at_ms) FROM spend_events"
            " WHERE attempt_id IN (SELECT value FROM json_each(?)) GROUP BY attempt_id",
            (json.dumps(attempt_ids),),
        )
        return {int(row[0]): int(row[1]) for row in rows}

    def attempt_files(self, attempt_id: int) -> dict[str, Any] | None:
        """The log and transcript paths the ledger recorded for an attempt (None: no such attempt)."""
        rows = self._read(
            "SELECT id, run_id, task_id, outcome, log_path, transcript_path FROM attempts WHERE id = ?",
            (attempt_id,),
        )
        return dict(rows[0]) if rows else None

    # --- the run page's first view and an opened attempt ---

    def run_record(self, run_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM runs WHERE id = ?", (run_id,))
        return dict(rows[0]) if rows else None

    def task_count(self, run_id: str) -> int:
        return int(self._read("SELECT count(*) FROM tasks WHERE run_id = ?", (run_id,))[0][0])

    def first_view_record(self, run_id: str) -> dict[str, Any]:
        """What the run page draws first, in the shape of LedgerReads.get_run but narrow: tasks without
        their prompts, attempts as timeline bars (no summaries, errors or paths but the log's, whose
        mtime tells a quiet attempt), and the run's commits, CI and clean-ups for its tables."""
        tasks = []
        for row in self._read(
            "SELECT id, title, status, reason, isolation, wave, branch, worktree, depends_on_json"
            " FROM tasks WHERE run_id = ? ORDER BY wave, rowid",
            (run_id,),
        ):
            task = dict(row)
            task["depends_on"] = json.loads(task.pop("depends_on_json") or "[]")
            tasks.append(task)
        attempts = [
            dict(row)
            for row in self._read(
                "SELECT id, task_id, node, started_at_ms, finished_at_ms, outcome, spend_usd,"
                " last_progress_ms, log_path FROM attempts WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
        ]
        commits = [
            dict(row)
            for row in self._read(
                "SELECT sha, task_id, attempt_id, branch, message, committed_at_ms FROM commits"
                " WHERE run_id = ? ORDER BY committed_at_ms, rowid",
                (run_id,),
            )
        ]
        return {"tasks": tasks, "attempts": attempts, "commits": commits, **self._run_tables(run_id)}

    def _run_tables(self, run_id: str) -> dict[str, list[dict[str, Any]]]:
        ci = []
        for row in self._read("SELECT * FROM ci WHERE run_id = ? ORDER BY branch", (run_id,)):
            entry = dict(row)
            entry["run_urls"] = json.loads(entry["run_urls_json"] or "[]")
            ci.append(entry)
        cleanups = self._read("SELECT * FROM cleanups WHERE run_id = ? ORDER BY id", (run_id,))
        return {"ci": ci, "cleanups": [dict(row) for row in cleanups]}

    def attempt_errors(self, attempt_ids: list[int]) -> dict[int, str]:
        """attempt id -> its recorded error, for the given attempts that have one."""
        if not attempt_ids:
            return {}
        rows = self._read(
            "SELECT id, error FROM attempts"
            " WHERE id IN (SELECT value FROM json_each(?)) AND error IS NOT NULL",
            (json.dumps(attempt_ids),),
        )
        return {int(row[0]): str(row[1]) for row in rows}

    def attempt_record(self, attempt_id: int) -> dict[str, Any] | None:
        """One attempt opened on the run page: its row, its task's id, title and branch, the commits it
        made and the CI of its branch (the task's own first, else the attempt's); None if there is none."""
        rows = self._read("SELECT * FROM attempts WHERE id = ?", (attempt_id,))
        if not rows:
            return None
        attempt = dict(rows[0])
        run_id = attempt["run_id"]
        task = self._read(
            "SELECT id, title, branch FROM tasks WHERE run_id = ? AND id = ?", (run_id, attempt["task_id"])
        )
        commits = self._read(
            "SELECT sha, branch, message, committed_at_ms FROM commits WHERE run_id = ? AND attempt_id = ?"
            " ORDER BY committed_at_ms, rowid",
            (run_id, attempt_id),
        )
        task_row = dict(task[0]) if task else {"id": attempt["task_id"], "title": None, "branch": None}
        ci = None
        for branch in (task_row["branch"], attempt["branch"]):
            found = self._read("SELECT * FROM ci WHERE run_id = ? AND branch = ?", (run_id, branch))
            if branch and found:
                ci = {**dict(found[0]), "run_urls": json.loads(found[0]["run_urls_json"] or "[]")}
                break
        return {"attempt": attempt, "task": task_row, "commits": [dict(r) for r in commits], "ci": ci}
