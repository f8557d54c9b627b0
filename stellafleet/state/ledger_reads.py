"""The fleet ledger's queries: what a running fleet, `stella runs`, the dashboard and `stella clean` read.

LedgerReads holds the one connection to fleet.db; Ledger (ledger.py) adds the writes on top of it, so a
caller opens one Ledger and both reads and writes through it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from stellafleet.core.errors import StellaError
from stellafleet.core.status import AttemptOutcome

# How far back the eager schedule looks for how long a task took before (past_durations): the same plan
# run again, or resumed, is among the last few runs.
PAST_RUNS = 20


class LedgerReads:
    """One open connection to fleet.db and the queries on it; safe to share between one process's threads."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, readonly: bool) -> None:
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    # --- runs (`stella runs`, the dashboard, run references) ---

    def latest_run_id(self) -> str | None:
        rows = self._read("SELECT id FROM runs ORDER BY created_at_ms DESC, id DESC LIMIT 1")
        return str(rows[0][0]) if rows else None

    def resolve_run_id(self, ref: str | None) -> str:
        """A full run id from None/"latest", an exact id, or a unique prefix; StellaError otherwise."""
        if ref is None or ref == "latest":
            latest = self.latest_run_id()
            if latest is None:
                raise StellaError(f"no fleet runs recorded in {self.path} yet: start one with `stella fleet`")
            return latest
        if self._read("SELECT 1 FROM runs WHERE id = ?", (ref,)):
            return ref
        matches = [
            str(row[0])
            for row in self._read(
                "SELECT id FROM runs WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 6", (len(ref), ref)
            )
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise StellaError(f"no run matches {ref!r}: `stella runs` lists the recorded runs")
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise StellaError(f"{ref!r} matches several runs ({shown}): give more of the run id")

    def resumed_by(self, run_id: str) -> list[str]:
        """The runs that resumed this one (`stella fleet --resume`), oldest first."""
        rows = self._read("SELECT id FROM runs WHERE resumed_from = ? ORDER BY created_at_ms, id", (run_id,))
        return [str(row[0]) for row in rows]

    def last_spend_ms(self, attempt_id: int) -> int | None:
        """When the attempt's latest spend event was recorded (None: it has none)."""
        rows = self._read("SELECT max(at_ms) FROM spend_events WHERE attempt_id = ?", (attempt_id,))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def count_runs(self) -> int:
        return int(self._read("SELECT count(*) FROM runs")[0][0])

    def list_runs(self, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """A page of runs, newest first, each with its task counts by status, attempt count and duration."""
        runs = [
            dict(row)
            for row in self._read(
                "SELECT * FROM runs ORDER BY created_at_ms DESC, id DESC LIMIT ? OFFSET ?", (limit, offset)
            )
        ]
        if not runs:
            return runs
        ids = json.dumps([run["id"] for run in runs])
        counts: dict[str, dict[str, int]] = {run["id"]: {} for run in runs}
        for row in self._read(
            "SELECT run_id, status, count(*) FROM tasks WHERE run_id IN (SELECT value FROM json_each(?))"
            " GROUP BY run_id, status",
            (ids,),
        ):
            counts[row[0]][row[1]] = int(row[2])
        attempts: dict[str, int] = {}
        for row in self._read(
            "SELECT run_id, count(*) FROM attempts WHERE run_id IN (SELECT value FROM json_each(?))"
            " GROUP BY run_id",
            (ids,),
        ):
            attempts[row[0]] = int(row[1])
        for run in runs:
            run["task_counts"] = counts[run["id"]]
            run["tasks_total"] = sum(counts[run["id"]].values())
            run["attempts_total"] = attempts.get(run["id"], 0)
            finished = run["finished_at_ms"]
            run["duration_ms"] = None if finished is None else finished - run["created_at_ms"]
        return runs

    def get_run(self, run_id: str) -> dict[str, Any]:
        """Everything recorded about one run; StellaError if the ledger has no such run."""
        found = self._read("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not found:
            raise StellaError(f"no run {run_id!r} in {self.path}: `stella runs` lists the recorded runs")
        tasks = []
        for row in self._read("SELECT * FROM tasks WHERE run_id = ? ORDER BY wave, rowid", (run_id,)):
            task = dict(row)
            task["depends_on"] = json.loads(task["depends_on_json"] or "[]")
            task["claims"] = json.loads(task["claims_json"] or "[]")
            tasks.append(task)
        ci = []
        for row in self._read("SELECT * FROM ci WHERE run_id = ? ORDER BY branch", (run_id,)):
            entry = dict(row)
            entry["run_urls"] = json.loads(entry["run_urls_json"] or "[]")
            ci.append(entry)
        return {
            "run": dict(found[0]),
            "tasks": tasks,
            "attempts": [
                dict(r) for r in self._read("SELECT * FROM attempts WHERE run_id = ? ORDER BY id", (run_id,))
            ],
            "commits": [
                dict(r)
                for r in self._read(
                    "SELECT * FROM commits WHERE run_id = ? ORDER BY committed_at_ms, rowid", (run_id,)
                )
            ],
            "ci": ci,
            "cleanups": [
                dict(r) for r in self._read("SELECT * FROM cleanups WHERE run_id = ? ORDER BY id", (run_id,))
            ],
            "merges": [
                {**dict(r), "files": json.loads(r["files_json"] or "[]")}
                for r in self._read("SELECT * FROM merges WHERE run_id = ? ORDER BY id", (run_id,))
            ],
        }

    # --- fleet (the run's own reads while it works) ---

    def run_spend(self, run_id: str) -> float:
        rows = self._read("SELECT spend_usd FROM runs WHERE id = ?", (run_id,))
        return float(rows[0][0]) if rows else 0.0

    def past_durations(self, tasks: Iterable[tuple[str, str | None, str]]) -> dict[str, float]:
        """Task id -> seconds the latest succeeded attempt of the same task took in one of the ledger's
        last PAST_RUNS runs, for tasks given as (id, prompt, pipeline): the same id, prompt and pipeline
        (the task's own, else its run's) make the same task. Tasks never seen are left out."""
        wanted = {task_id: (prompt, pipeline) for task_id, prompt, pipeline in tasks}
        rows = self._read(
            "SELECT a.task_id, t.prompt, coalesce(t.pipeline, r.pipeline), a.finished_at_ms - a.started_at_ms"
            " FROM (SELECT id, pipeline FROM runs ORDER BY created_at_ms DESC, id DESC LIMIT ?) AS r"
            " JOIN attempts a ON a.run_id = r.id JOIN tasks t ON t.run_id = a.run_id AND t.id = a.task_id"
            " WHERE a.outcome = ? AND a.finished_at_ms IS NOT NULL ORDER BY a.id",
            (PAST_RUNS, str(AttemptOutcome.SUCCEEDED)),
        )
        found: dict[str, float] = {}
        for task_id, prompt, pipeline, elapsed_ms in rows:  # oldest first: the latest one stays
            if wanted.get(task_id) == (prompt, pipeline):
                found[task_id] = max(int(elapsed_ms), 0) / 1000
        return found

    def attempt_spend(self, attempt_id: int) -> float:
        """Dollars recorded so far for one attempt (0 for an unknown attempt)."""
        rows = self._read("SELECT spend_usd FROM attempts WHERE id = ?", (attempt_id,))
        return float(rows[0][0]) if rows else 0.0

    def attempt_identity(self, attempt_id: int) -> dict[str, Any] | None:
        """What proves a process acts for an attempt: its run, task, outcome, worker pid and token hash."""
        rows = self._read(
            "SELECT run_id, task_id, outcome, pid, started_at_ms, token_sha256 FROM attempts WHERE id = ?",
            (attempt_id,),
        )
        return dict(rows[0]) if rows else None

    def running_progress(self, run_id: str) -> dict[str, tuple[int, float]]:
        """task id -> (steps, dollars) of the run's attempts that are still running."""
        rows = self._read(
            "SELECT task_id, steps, spend_usd FROM attempts WHERE run_id = ? AND outcome = ?",
            (run_id, str(AttemptOutcome.RUNNING)),
        )
        return {str(row[0]): (int(row[1]), float(row[2])) for row in rows}

    # --- clean (stella clean) ---

    def runs_with_workspaces(self) -> list[str]:
        """Ids of the runs whose tasks or attempts recorded a branch or a worktree, newest first."""
        rows = self._read(
            "SELECT id FROM runs WHERE id IN ("
            " SELECT run_id FROM tasks WHERE branch IS NOT NULL OR worktree IS NOT NULL"
            " UNION SELECT run_id FROM attempts WHERE branch IS NOT NULL OR worktree IS NOT NULL)"
            " ORDER BY created_at_ms DESC, id DESC"
        )
        return [str(row[0]) for row in rows]
