"""The fleet ledger: every run, task, attempt, commit and dollar, in `.stella/private/fleet.db`.

Its tables and columns are a public interface (users query them with sqlite3; docs/ledger.md lists them).
All ledger SQL lives in this module. Many processes write at once: each write is one short
``BEGIN IMMEDIATE`` transaction in WAL mode, and spend is added with increments, never read-modify-write
in Python. All times are epoch milliseconds.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import StellaError
from stellafleet.state.sqlitefile import Schema, open_database, write_transaction

RUN_STATUSES = ("running", "succeeded", "failed", "spend_limited", "interrupted")
TASK_STATUSES = ("pending", "running", "succeeded", "failed", "skipped", "interrupted")
ATTEMPT_OUTCOMES = ("running", "succeeded", "failed", "interrupted")

_V1 = (
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER,
        status TEXT NOT NULL DEFAULT 'running',
        plan_path TEXT,
        plan_sha256 TEXT,
        base_ref TEXT,
        base_commit TEXT,
        max_concurrency INTEGER,
        spend_limit_usd REAL,
        spend_usd REAL NOT NULL DEFAULT 0,
        pipeline TEXT,
        argv TEXT,
        root TEXT,
        pid INTEGER,
        exit_code INTEGER,
        reason TEXT
    )""",
    "CREATE INDEX runs_by_created ON runs(created_at_ms, id)",
    """CREATE TABLE tasks (
        run_id TEXT NOT NULL,
        id TEXT NOT NULL,
        title TEXT,
        prompt TEXT,
        depends_on_json TEXT NOT NULL DEFAULT '[]',
        claims_json TEXT NOT NULL DEFAULT '[]',
        isolation TEXT NOT NULL DEFAULT 'shared',
        wave INTEGER,
        status TEXT NOT NULL DEFAULT 'pending',
        reason TEXT,
        pipeline TEXT,
        model TEXT,
        timeout_s REAL,
        branch TEXT,
        worktree TEXT,
        PRIMARY KEY (run_id, id)
    )""",
    """CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER,
        success INTEGER,
        outcome TEXT NOT NULL DEFAULT 'running',
        branch TEXT,
        worktree TEXT,
        pid INTEGER,
        exit_code INTEGER,
        spend_usd REAL NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        summary TEXT,
        error TEXT,
        cpu_seconds REAL,
        peak_rss_bytes INTEGER,
        pipeline TEXT,
        log_path TEXT,
        transcript_path TEXT
    )""",
    "CREATE INDEX attempts_by_run ON attempts(run_id, task_id)",
    """CREATE TABLE commits (
        sha TEXT NOT NULL,
        run_id TEXT NOT NULL,
        task_id TEXT,
        attempt_id INTEGER,
        branch TEXT,
        message TEXT,
        committed_at_ms INTEGER,
        PRIMARY KEY (run_id, sha)
    )""",
    """CREATE TABLE ci (
        run_id TEXT NOT NULL,
        branch TEXT NOT NULL,
        task_id TEXT,
        head_sha TEXT,
        pr_url TEXT,
        pr_number INTEGER,
        state TEXT,
        conclusion TEXT,
        reason TEXT,
        run_urls_json TEXT NOT NULL DEFAULT '[]',
        updated_at_ms INTEGER,
        PRIMARY KEY (run_id, branch)
    )""",
    """CREATE TABLE cleanups (
        id INTEGER PRIMARY KEY,
        run_id TEXT,
        task_id TEXT,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT,
        at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX cleanups_by_run ON cleanups(run_id)",
    """CREATE TABLE spend_events (
        id INTEGER PRIMARY KEY,
        attempt_id INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        usd REAL NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX spend_events_by_attempt ON spend_events(attempt_id)",
    "CREATE INDEX spend_events_by_run ON spend_events(run_id)",
)

# Forward migrations: MIGRATIONS[n] takes a ledger from user_version n to n + 1. Append, never edit.
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1,)

LEDGER_SCHEMA = Schema(label="fleet ledger", application_id=0x53544C46, migrations=MIGRATIONS)  # "STLF"


class TaskSpec(Protocol):
    """What the ledger reads from a plan task (plan.PlanTask satisfies it)."""

    @property
    def id(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def prompt(self) -> str: ...
    @property
    def depends_on(self) -> tuple[str, ...]: ...
    @property
    def claims(self) -> tuple[str, ...]: ...
    @property
    def isolation(self) -> str: ...
    @property
    def pipeline(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def timeout(self) -> float | None: ...


def _check_choice(kind: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}: expected one of {', '.join(allowed)}")


class Ledger:
    """One open connection to fleet.db; safe to share between the threads of one process."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, readonly: bool, now_ms: Callable[[], int]):
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self._now_ms = now_ms
        self._lock = threading.RLock()

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, now_ms: Callable[[], int] = wall_ms) -> Ledger:
        """Open the ledger at path, creating it atomically unless readonly; StellaError if it is not one."""
        conn = open_database(Path(path), LEDGER_SCHEMA, readonly=readonly)
        return cls(conn, Path(path), readonly=readonly, now_ms=now_ms)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StellaError(f"the fleet ledger at {self.path} was opened read-only")
        with self._lock, write_transaction(self._conn) as conn:
            yield conn

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    # --- runs ---

    def create_run(
        self,
        *,
        run_id: str,
        plan_path: str | None,
        plan_sha256: str | None,
        base_ref: str,
        base_commit: str,
        max_concurrency: int,
        spend_limit_usd: float | None,
        pipeline: str,
        argv: list[str],
        root: str,
        pid: int,
    ) -> None:
        with self._write() as conn:
            try:
                conn.execute(
                    "INSERT INTO runs (id, created_at_ms, status, plan_path, plan_sha256, base_ref,"
                    " base_commit, max_concurrency, spend_limit_usd, pipeline, argv, root, pid)"
                    " VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        self._now_ms(),
                        plan_path,
                        plan_sha256,
                        base_ref,
                        base_commit,
                        max_concurrency,
                        spend_limit_usd,
                        pipeline,
                        json.dumps(argv),
                        root,
                        pid,
                    ),
                )
            except sqlite3.IntegrityError:
                raise StellaError(f"run {run_id} is already in the ledger {self.path}") from None

    def finish_run(self, run_id: str, status: str, *, exit_code: int, reason: str | None = None) -> None:
        _check_choice("run status", status, RUN_STATUSES)
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET status = ?, finished_at_ms = ?, exit_code = ?, reason = ? WHERE id = ?",
                (status, self._now_ms(), exit_code, reason, run_id),
            )

    def run_spend(self, run_id: str) -> float:
        rows = self._read("SELECT spend_usd FROM runs WHERE id = ?", (run_id,))
        return float(rows[0][0]) if rows else 0.0

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
        }

    # --- tasks ---

    def add_tasks(self, run_id: str, tasks: Iterable[TaskSpec], waves: dict[str, int]) -> None:
        rows = [
            (
                run_id,
                task.id,
                task.title,
                task.prompt,
                json.dumps(list(task.depends_on)),
                json.dumps(list(task.claims)),
                task.isolation,
                waves.get(task.id),
                task.pipeline,
                task.model,
                task.timeout,
            )
            for task in tasks
        ]
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO tasks (run_id, id, title, prompt, depends_on_json, claims_json, isolation, wave,"
                " pipeline, model, timeout_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def set_task_status(self, run_id: str, task_id: str, status: str, reason: str | None = None) -> None:
        _check_choice("task status", status, TASK_STATUSES)
        with self._write() as conn:
            conn.execute(
                "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND id = ?",
                (status, reason, run_id, task_id),
            )

    def set_task_workspace(self, run_id: str, task_id: str, branch: str | None, worktree: str | None) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE tasks SET branch = ?, worktree = ? WHERE run_id = ? AND id = ?",
                (branch, worktree, run_id, task_id),
            )

    # --- attempts ---

    def start_attempt(
        self,
        run_id: str,
        task_id: str,
        *,
        pipeline: str,
        branch: str | None = None,
        worktree: str | None = None,
        log_path: str | None = None,
        transcript_path: str | None = None,
    ) -> int:
        """A new running attempt for the task, whose status becomes `running` in the same transaction."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO attempts (run_id, task_id, started_at_ms, outcome, pipeline, branch, worktree,"
                " log_path, transcript_path) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, task_id, self._now_ms(), pipeline, branch, worktree, log_path, transcript_path),
            )
            attempt_id = cursor.lastrowid
            conn.execute(
                "UPDATE tasks SET status = 'running', reason = NULL WHERE run_id = ? AND id = ?",
                (run_id, task_id),
            )
        assert attempt_id is not None
        return int(attempt_id)

    def set_attempt_pid(self, attempt_id: int, pid: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE attempts SET pid = ? WHERE id = ?", (pid, attempt_id))

    def add_spend(
        self, attempt_id: int, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0
    ) -> None:
        """Add to an attempt's (and its run's) spend, tokens and steps; safe from many processes."""
        with self._write() as conn:
            row = conn.execute("SELECT run_id FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row is None:
                raise StellaError(f"no attempt {attempt_id} in the fleet ledger {self.path}")
            run_id = row[0]
            conn.execute(
                "INSERT INTO spend_events (attempt_id, run_id, usd, input_tokens, output_tokens, at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (attempt_id, run_id, usd, input_tokens, output_tokens, self._now_ms()),
            )
            conn.execute(
                "UPDATE attempts SET spend_usd = spend_usd + ?, input_tokens = input_tokens + ?,"
                " output_tokens = output_tokens + ?, steps = steps + ? WHERE id = ?",
                (usd, input_tokens, output_tokens, steps, attempt_id),
            )
            conn.execute("UPDATE runs SET spend_usd = spend_usd + ? WHERE id = ?", (usd, run_id))

    def finish_attempt(
        self,
        attempt_id: int,
        *,
        outcome: str,
        exit_code: int | None,
        summary: str,
        error: str | None = None,
        cpu_seconds: float | None = None,
        peak_rss_bytes: int | None = None,
        reason: str | None = None,
        transcript_written: bool = True,
    ) -> float:
        """Close the attempt and set its task's status to the outcome (with reason) in one transaction;
        returns the attempt's recorded spend in dollars. A pipeline that wrote no transcript leaves no
        transcript path behind (`transcript_written=False`)."""
        _check_choice("attempt outcome", outcome, ATTEMPT_OUTCOMES)
        with self._write() as conn:
            row = conn.execute(
                "SELECT run_id, task_id, spend_usd FROM attempts WHERE id = ?", (attempt_id,)
            ).fetchone()
            if row is None:
                raise StellaError(f"no attempt {attempt_id} in the fleet ledger {self.path}")
            conn.execute(
                "UPDATE attempts SET finished_at_ms = ?, outcome = ?, success = ?, exit_code = ?,"
                " summary = ?, error = ?, cpu_seconds = ?, peak_rss_bytes = ?,"
                " transcript_path = CASE WHEN ? THEN transcript_path END WHERE id = ?",
                (
                    self._now_ms(),
                    outcome,
                    1 if outcome == "succeeded" else 0,
                    exit_code,
                    summary,
                    error,
                    cpu_seconds,
                    peak_rss_bytes,
                    transcript_written,
                    attempt_id,
                ),
            )
            conn.execute(
                "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND id = ?",
                (outcome, reason, row[0], row[1]),
            )
        return float(row[2])

    # --- commits, CI, cleanups ---

    def record_commit(
        self,
        *,
        sha: str,
        run_id: str,
        task_id: str,
        attempt_id: int | None,
        branch: str | None,
        message: str,
        committed_at_ms: int,
    ) -> bool:
        """Record one commit of a task; False (and nothing changed) if this run already has it."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO commits (sha, run_id, task_id, attempt_id, branch, message,"
                " committed_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sha, run_id, task_id, attempt_id, branch, message, committed_at_ms),
            )
            return cursor.rowcount == 1

    def upsert_ci(
        self,
        *,
        run_id: str,
        branch: str,
        task_id: str | None,
        head_sha: str | None,
        pr_url: str | None,
        pr_number: int | None,
        state: str,
        conclusion: str | None,
        reason: str | None,
        run_urls: list[str],
    ) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO ci (run_id, branch, task_id, head_sha, pr_url, pr_number, state, conclusion,"
                " reason, run_urls_json, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, branch) DO UPDATE SET task_id = excluded.task_id,"
                " head_sha = excluded.head_sha, pr_url = excluded.pr_url, pr_number = excluded.pr_number,"
                " state = excluded.state, conclusion = excluded.conclusion, reason = excluded.reason,"
                " run_urls_json = excluded.run_urls_json, updated_at_ms = excluded.updated_at_ms",
                (
                    run_id,
                    branch,
                    task_id,
                    head_sha,
                    pr_url,
                    pr_number,
                    state,
                    conclusion,
                    reason,
                    json.dumps(list(run_urls)),
                    self._now_ms(),
                ),
            )

    def record_cleanup(
        self,
        *,
        run_id: str | None,
        task_id: str | None,
        kind: str,
        target: str,
        action: str,
        reason: str | None,
    ) -> None:
        _check_choice("cleanup kind", kind, ("worktree", "branch"))
        _check_choice("cleanup action", action, ("removed", "kept"))
        with self._write() as conn:
            conn.execute(
                "INSERT INTO cleanups (run_id, task_id, kind, target, action, reason, at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, task_id, kind, target, action, reason, self._now_ms()),
            )

    # --- fleet (the run's own reads while it works) ---

    def attempt_spend(self, attempt_id: int) -> float:
        """Dollars recorded so far for one attempt (0 for an unknown attempt)."""
        rows = self._read("SELECT spend_usd FROM attempts WHERE id = ?", (attempt_id,))
        return float(rows[0][0]) if rows else 0.0

    def running_progress(self, run_id: str) -> dict[str, tuple[int, float]]:
        """task id -> (steps, dollars) of the run's attempts that are still running."""
        rows = self._read(
            "SELECT task_id, steps, spend_usd FROM attempts WHERE run_id = ? AND outcome = 'running'",
            (run_id,),
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
