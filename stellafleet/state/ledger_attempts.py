"""The ledger's `attempts`, `spend_events` and `limit_events` tables, and what earlier attempts took."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.limits import LimitEvent, LimitKind
from stellafleet.core.spend import check_count, check_usd
from stellafleet.core.status import AttemptEnd, AttemptOutcome, TaskStatus
from stellafleet.state.ledger_schema import check_choice
from stellafleet.state.sqlitefile import Table

# The columns of an attempt the run page's first view draws as a timeline bar.
BAR_COLUMNS = (
    "id, task_id, node, started_at_ms, finished_at_ms, outcome, spend_usd, last_progress_ms, log_path,"
    " salvage_sha"
)
IN_LIST = "IN (SELECT value FROM json_each(?))"


class Attempts(Table):
    """The attempts table: one row per run of a task's worker, from its start to its outcome."""

    def start(
        self,
        run_id: str,
        task_id: str,
        *,
        pipeline: str,
        branch: str | None = None,
        worktree: str | None = None,
        log_path: str | None = None,
        transcript_path: str | None = None,
        token_sha256: str | None = None,
        guard_usd: float | None = None,
    ) -> int:
        """A new running attempt for the task (its status `running` in the same transaction)."""
        paths = (branch, worktree, log_path, transcript_path, token_sha256, guard_usd)
        with self._db.write() as conn:
            cursor = conn.execute(
                "INSERT INTO attempts (run_id, task_id, started_at_ms, outcome, pipeline, branch, worktree,"
                " log_path, transcript_path, token_sha256, guard_usd)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, task_id, self._db.now_ms(), str(AttemptOutcome.RUNNING), pipeline, *paths),
            )
            attempt_id = cursor.lastrowid
            conn.execute(
                "UPDATE tasks SET status = ?, reason = NULL WHERE run_id = ? AND id = ?",
                (str(TaskStatus.RUNNING), run_id, task_id),
            )
        assert attempt_id is not None
        return int(attempt_id)

    def _set(self, attempt_id: int, assignments: str, *values: Any) -> None:
        self._db.execute(f"UPDATE attempts SET {assignments} WHERE id = ?", (*values, attempt_id))

    def set_pid(self, attempt_id: int, pid: int) -> None:
        """The worker's pid and start time, read now (the fleet's child keeps its pid until reaped); with no
        process at pid, now: any process there later is another."""
        from stellafleet.proc.pids import process_start_time  # the fleet's: a worker loads no psutil

        started = process_start_time(pid)
        at_ms = self._db.now_ms() if started is None else round(started * 1000)
        self._set(attempt_id, "pid = ?, pid_started_ms = ?", pid, at_ms)

    def set_progress(self, attempt_id: int, at_ms: int | None = None) -> None:
        """The last time the attempt's worker showed progress (CPU time, output or spend; default now)."""
        self._set(attempt_id, "last_progress_ms = ?", self._db.now_ms() if at_ms is None else at_ms)

    def set_reason(self, attempt_id: int, reason: str) -> None:
        """Why an attempt beyond a task's first exists (`ci-fix`: a --fix-ci round)."""
        self._set(attempt_id, "reason = ?", reason)

    def set_node(self, attempt_id: int, node: str) -> None:
        """The node a remote attempt runs on; it has no worktree here (its clone is on the node)."""
        self._set(attempt_id, "node = ?, worktree = NULL", node)

    def set_setup_started(self, attempt_id: int) -> None:
        """The attempt's `[worktree] setup` starts now (the dashboard shows it in setup until set_setup)."""
        self._set(attempt_id, "setup_started_ms = ?", self._db.now_ms())

    def set_setup(self, attempt_id: int, seconds: float) -> None:
        """How long the attempt's `[worktree] setup` command ran (whether it succeeded or not)."""
        self._set(attempt_id, "setup_ms = ?", round(seconds * 1000))

    def set_unclaimed_writes(self, attempt_id: int, paths: Sequence[str]) -> None:
        """The files a shared attempt changed that neither it nor another running task claimed."""
        self._set(attempt_id, "unclaimed_writes = ?", json.dumps(list(paths)))

    def set_worktree_index(self, attempt_id: int, index: int) -> None:
        """The STELLA_WORKTREE_INDEX its worktree had (its teardown gets it again)."""
        self._set(attempt_id, "worktree_index = ?", index)

    def set_salvage(self, attempt_id: int, ref: str, sha: str) -> None:
        """The commit that keeps what the unfinished attempt left uncommitted (git/salvage.py)."""
        self._set(attempt_id, "salvage_ref = ?, salvage_sha = ?", ref, sha)

    def set_start(self, attempt_id: int, commit: str, parents: Iterable[tuple[str, str]]) -> None:
        """The commit a stacked attempt's worktree starts at, and each (parent task, its commit) in it."""
        shown = json.dumps([{"task": task, "commit": sha} for task, sha in parents])
        self._set(attempt_id, "start_commit = ?, start_parents_json = ?", commit, shown)

    def start_of(self, run_id: str, task_id: str) -> str | None:
        """The start commit of the task's latest stacked attempt in the run (None: none was stacked)."""
        rows = self._db.read(
            "SELECT start_commit FROM attempts WHERE run_id = ? AND task_id = ? AND start_commit IS NOT NULL"
            " ORDER BY id DESC LIMIT 1",
            (run_id, task_id),
        )
        return str(rows[0][0]) if rows else None

    def set_steps(self, attempt_id: int, steps: int) -> None:
        """The remote attempt's step count as its worker reported it (steps travel once, at the end)."""
        self._set(attempt_id, "steps = MAX(steps, ?)", steps)

    def finish(self, attempt_id: int, end: AttemptEnd, *, transcript_written: bool = True) -> float:
        """Close the attempt and set its task's status in one transaction; returns its recorded dollars."""
        stored = check_choice("attempt outcome", end.outcome, AttemptOutcome)
        success = 1 if end.outcome == AttemptOutcome.SUCCEEDED else 0
        measured = (end.exit_code, end.summary, end.error, end.cpu_seconds, end.peak_rss_bytes)
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT run_id, task_id, spend_usd FROM attempts WHERE id = ?", (attempt_id,)
            ).fetchone()
            if row is None:
                raise StellaError(f"no attempt {attempt_id} in the fleet ledger {self._db.path}")
            conn.execute(
                "UPDATE attempts SET finished_at_ms = ?, outcome = ?, success = ?, exit_code = ?,"
                " summary = ?, error = ?, cpu_seconds = ?, peak_rss_bytes = ?,"
                " transcript_path = CASE WHEN ? THEN transcript_path END WHERE id = ?",
                (self._db.now_ms(), stored, success, *measured, transcript_written, attempt_id),
            )
            conn.execute(
                "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND id = ?",
                (stored, end.reason, row[0], row[1]),
            )
        return float(row[2])

    def get(self, attempt_id: int, columns: str = "*") -> dict[str, Any] | None:
        return self._db.row(f"SELECT {columns} FROM attempts WHERE id = ?", (attempt_id,))

    def identity(self, attempt_id: int) -> dict[str, Any] | None:
        """What proves a process acts for an attempt: its run, task, outcome, worker pid and token hash."""
        return self.get(
            attempt_id, "run_id, task_id, outcome, pid, pid_started_ms, started_at_ms, token_sha256"
        )

    def files(self, attempt_id: int) -> dict[str, Any] | None:
        """The log and transcript paths the ledger recorded for an attempt (None: no such attempt)."""
        return self.get(attempt_id, "id, run_id, task_id, outcome, log_path, transcript_path")

    def steps(self, attempt_id: int) -> int:
        found = self.get(attempt_id, "steps")
        return int(found["steps"]) if found else 0

    def number_of(self, attempt_id: int) -> int:
        """The attempt's number among its task's attempts in its run (1: the first), as people read it."""
        row = self._db.row(
            "SELECT count(*) AS n FROM attempts AS a JOIN attempts AS me ON me.id = ? "
            "WHERE a.run_id = me.run_id AND a.task_id = me.task_id AND a.id <= me.id",
            (attempt_id,),
        )
        return int(row["n"]) if row else 0

    def of_run(self, run_id: str, columns: str = "*") -> list[dict[str, Any]]:
        return self._db.rows(f"SELECT {columns} FROM attempts WHERE run_id = ? ORDER BY id", (run_id,))

    def running(self, run_id: str) -> list[dict[str, Any]]:
        return self._db.rows(
            "SELECT id, pid, pid_started_ms FROM attempts WHERE run_id = ? AND outcome = ?",
            (run_id, str(AttemptOutcome.RUNNING)),
        )

    def running_progress(self, run_id: str) -> dict[str, tuple[int, float]]:
        """task id -> (steps, dollars) of the run's attempts that are still running."""
        rows = self._db.read(
            "SELECT task_id, steps, spend_usd FROM attempts WHERE run_id = ? AND outcome = ?",
            (run_id, str(AttemptOutcome.RUNNING)),
        )
        return {str(row[0]): (int(row[1]), float(row[2])) for row in rows}

    def errors(self, attempt_ids: list[int]) -> dict[int, str]:
        rows = self._db.read(
            f"SELECT id, error FROM attempts WHERE id {IN_LIST} AND error IS NOT NULL",
            (json.dumps(attempt_ids),),
        )
        return {int(row[0]): str(row[1]) for row in rows}

    def failed_in_latest_run(self) -> list[tuple[Any, ...]]:
        """The rows of FAILED_IN_LATEST_RUN (docs/ledger.md's first example, which `stella demo` shows)."""
        return [tuple(row) for row in self._db.read(FAILED_IN_LATEST_RUN)]


FAILED_IN_LATEST_RUN = """\
SELECT a.task_id, a.branch, a.summary, a.error
  FROM attempts a
 WHERE a.run_id = (SELECT id FROM runs ORDER BY created_at_ms DESC LIMIT 1)
   AND a.success = 0;"""


@dataclass(frozen=True)
class SpendEvent:
    """One spend event of an attempt; seq orders it within the attempt and makes re-delivery harmless."""

    seq: int
    usd: float
    input_tokens: int
    output_tokens: int


class Spend(Table):
    """The spend_events table and the totals it adds to (attempts, runs), by increments in SQL only."""

    def add(
        self,
        attempt_id: int,
        usd: float,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        steps: int = 0,
        seq: int | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> bool:
        """Add to an attempt's and its run's spend, tokens and steps; a re-delivered seq adds nothing."""
        try:
            usd = check_usd(usd)
            names = ("input_tokens", "output_tokens", "steps", "cache_read_tokens", "cache_write_tokens")
            given = (input_tokens, output_tokens, steps, cache_read_tokens, cache_write_tokens)
            input_tokens, output_tokens, steps, *cached = map(check_count, given, names)
        except ValueError as exc:
            raise StellaError(f"refused a spend report for attempt {attempt_id}: {exc}") from None
        with self._db.write() as conn:
            row = conn.execute("SELECT run_id FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row is None:
                raise StellaError(f"no attempt {attempt_id} in the fleet ledger {self._db.path}")
            cursor = conn.execute(
                "INSERT INTO spend_events (attempt_id, run_id, usd, input_tokens, output_tokens, at_ms, seq,"
                " cache_read_tokens, cache_write_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (attempt_id, row[0], usd, input_tokens, output_tokens, self._db.now_ms(), seq, *cached),
            )
            if cursor.rowcount == 0:
                return False  # this seq was recorded before
            conn.execute(
                "UPDATE attempts SET spend_usd = spend_usd + ?, input_tokens = input_tokens + ?,"
                " output_tokens = output_tokens + ?, steps = steps + ?,"
                " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?"
                " WHERE id = ?",
                (usd, input_tokens, output_tokens, steps, *cached, attempt_id),
            )
            conn.execute("UPDATE runs SET spend_usd = spend_usd + ? WHERE id = ?", (usd, row[0]))
        return True

    def _total(self, table: str, row_id: int | str) -> float:
        rows = self._db.read(f"SELECT spend_usd FROM {table} WHERE id = ?", (row_id,))
        return float(rows[0][0]) if rows else 0.0

    def of_run(self, run_id: str) -> float:
        return self._total("runs", run_id)

    def of_attempt(self, attempt_id: int) -> float:
        """Dollars recorded so far for one attempt (0 for an unknown attempt)."""
        return self._total("attempts", attempt_id)

    def last_ms(self, attempt_id: int) -> int | None:
        """When the attempt's latest spend event was recorded (None: it has none)."""
        return self.last_ms_of([attempt_id]).get(attempt_id)

    def last_ms_of(self, attempt_ids: list[int]) -> dict[int, int]:
        rows = self._db.read(
            f"SELECT attempt_id, max(at_ms) FROM spend_events WHERE attempt_id {IN_LIST} GROUP BY attempt_id",
            (json.dumps(attempt_ids),),
        )
        return {int(row[0]): int(row[1]) for row in rows}

    def after(self, attempt_id: int, after: int) -> list[SpendEvent]:
        """The attempt's spend events past seq `after` (a scratch ledger's row ids are the sequence)."""
        rows = self._db.read(
            "SELECT id, usd, input_tokens, output_tokens FROM spend_events"
            " WHERE attempt_id = ? AND id > ? ORDER BY id",
            (attempt_id, after),
        )
        return [SpendEvent(int(r[0]), float(r[1]), int(r[2]), int(r[3])) for r in rows]

    def buckets(self, run_id: str, *, start_ms: int, end_ms: int, points: int) -> list[tuple[int, float]]:
        """The run's spend summed into `points` equal time buckets: (time of the last event, dollars)."""
        rows = self._db.read(
            "SELECT min(?, max(0, (at_ms - ?) * ? / ?)) AS bucket, max(at_ms), sum(usd) FROM spend_events"
            " WHERE run_id = ? GROUP BY bucket ORDER BY bucket",
            (points - 1, start_ms, points, max(1, end_ms - start_ms), run_id),
        )
        return [(int(row[1]), float(row[2])) for row in rows]

    def sparklines(self, runs: list[dict[str, Any]], *, points: int, now_ms: int) -> dict[str, list[float]]:
        """Cumulative dollars per run at `points` steps from its start to its end (a running one's: now)."""
        lines: dict[str, list[float]] = {}
        for run in runs:
            start_ms, end_ms = run["created_at_ms"], run["finished_at_ms"] or now_ms
            rows = self._db.read(
                "SELECT min(?, max(0, (coalesce(finished_at_ms, ?) - ?) * ? / ?)) AS bucket, sum(spend_usd)"
                " FROM attempts WHERE run_id = ? AND spend_usd > 0 GROUP BY bucket",
                (points - 1, now_ms, start_ms, points, max(1, end_ms - start_ms), run["id"]),
            )
            buckets = [0.0] * points
            for bucket, usd in rows:
                buckets[int(bucket)] += float(usd)
            lines[run["id"]] = [round(total, 6) for total in itertools.accumulate(buckets)]
        return lines


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
        """The reset of the run's most recent rate limit that named one (epoch ms; None: none reported):
        the provider's newest answer, nearer or further than the ones before."""
        rows = self._db.read(
            "SELECT reset_at_ms FROM limit_events WHERE run_id = ? AND kind = ? AND reset_at_ms IS NOT NULL"
            " ORDER BY id DESC LIMIT 1",
            (run_id, str(LimitKind.RATE)),
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else None


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
_ATTEMPTS = (
    f"SELECT a.spend_usd, a.finished_at_ms - a.started_at_ms, a.setup_ms FROM {_FROM} AND a.outcome IN (?, ?)"
)
# how far back past_durations looks: the same plan run again, or resumed, is among the last few runs
PAST_RUNS = 20


@dataclass(frozen=True)
class Past:
    """One earlier attempt: what it spent and how long it took, its `[worktree] setup` included."""

    usd: float
    seconds: float
    setup_seconds: float | None = None  # None: no setup ran


class History(Table):
    """What earlier runs took, for `stella fleet --estimate` and the eager schedule: finished attempts' spend
    and duration, found by the same task or by the same pipeline and model."""

    def _past(self, where: str, params: tuple[object, ...]) -> list[Past]:
        rows = self._db.read(f"{_ATTEMPTS} AND {where} ORDER BY a.id", (*ENDED, *params))
        return [
            Past(float(usd), max(int(ms), 0) / 1000, None if setup is None else setup / 1000)
            for usd, ms, setup in rows
        ]

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
