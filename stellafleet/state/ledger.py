"""The fleet ledger: every run, task, attempt, commit and dollar, in `.stella/private/fleet.db`.

Its tables and columns are a public interface (users query them with sqlite3; docs/ledger.md lists them).
All ledger SQL lives in the ledger modules: the writes here, the queries in ledger_reads.py, the tables
in ledger_schema.py. Many processes write at once: each write is one short ``BEGIN IMMEDIATE``
transaction in WAL mode, and spend is added with increments, never read-modify-write in Python. All
times are epoch milliseconds.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import StellaError
from stellafleet.core.spend import check_report
from stellafleet.core.status import AttemptOutcome, CIState, RunStatus, TaskStatus
from stellafleet.state.ledger_merges import LedgerMerges
from stellafleet.state.ledger_schema import LEDGER_SCHEMA
from stellafleet.state.sqlitefile import open_database, write_transaction

# What the ledger's status columns accept (docs/ledger.md lists them): the values of the status types.
RUN_STATUSES = tuple(RunStatus)
TASK_STATUSES = tuple(TaskStatus)
ATTEMPT_OUTCOMES = tuple(AttemptOutcome)
CI_STATES = tuple(CIState)


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


def _check_choice(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    """value as the plain text the ledger stores; ValueError unless it is one of allowed."""
    if value not in allowed:
        raise ValueError(f"unknown {kind} {str(value)!r}: expected one of {', '.join(allowed)}")
    return str(value)


class Ledger(LedgerMerges):
    """One open connection to fleet.db, for reads (LedgerReads) and writes; safe to share between threads."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, readonly: bool, now_ms: Callable[[], int]):
        super().__init__(conn, path, readonly=readonly)
        self._now_ms = now_ms

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, now_ms: Callable[[], int] = wall_ms) -> Ledger:
        """Open the ledger at path, creating it atomically unless readonly; StellaError if it is not one."""
        conn = open_database(Path(path), LEDGER_SCHEMA, readonly=readonly)
        return cls(conn, Path(path), readonly=readonly, now_ms=now_ms)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StellaError(f"the fleet ledger at {self.path} was opened read-only")
        with self._lock, write_transaction(self._conn) as conn:
            yield conn

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
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        self._now_ms(),
                        str(RunStatus.RUNNING),
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

    def finish_run(
        self, run_id: str, status: RunStatus, *, exit_code: int, reason: str | None = None
    ) -> None:
        stored = _check_choice("run status", status, RUN_STATUSES)
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET status = ?, finished_at_ms = ?, exit_code = ?, reason = ? WHERE id = ?",
                (stored, self._now_ms(), exit_code, reason, run_id),
            )

    def set_run_lineage(self, run_id: str, *, schedule: str, resumed_from: str | None = None) -> None:
        """Which schedule the run uses and the run it resumes (`stella fleet --resume`), if any."""
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET schedule = ?, resumed_from = ? WHERE id = ?",
                (schedule, resumed_from, run_id),
            )

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

    def set_task_status(
        self, run_id: str, task_id: str, status: TaskStatus, reason: str | None = None
    ) -> None:
        stored = _check_choice("task status", status, TASK_STATUSES)
        with self._write() as conn:
            conn.execute(
                "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND id = ?",
                (stored, reason, run_id, task_id),
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
        token_sha256: str | None = None,
    ) -> int:
        """A new running attempt for the task, whose status becomes `running` in the same transaction."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO attempts (run_id, task_id, started_at_ms, outcome, pipeline, branch, worktree,"
                " log_path, transcript_path, token_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    task_id,
                    self._now_ms(),
                    str(AttemptOutcome.RUNNING),
                    pipeline,
                    branch,
                    worktree,
                    log_path,
                    transcript_path,
                    token_sha256,
                ),
            )
            attempt_id = cursor.lastrowid
            conn.execute(
                "UPDATE tasks SET status = ?, reason = NULL WHERE run_id = ? AND id = ?",
                (str(TaskStatus.RUNNING), run_id, task_id),
            )
        assert attempt_id is not None
        return int(attempt_id)

    def set_attempt_pid(self, attempt_id: int, pid: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE attempts SET pid = ? WHERE id = ?", (pid, attempt_id))

    def set_attempt_progress(self, attempt_id: int, at_ms: int) -> None:
        """The last time the attempt's worker showed progress (CPU time, output or spend)."""
        with self._write() as conn:
            conn.execute("UPDATE attempts SET last_progress_ms = ? WHERE id = ?", (at_ms, attempt_id))

    def set_attempt_reason(self, attempt_id: int, reason: str) -> None:
        """Why an attempt beyond a task's first exists (`ci-fix`: a --fix-ci round)."""
        with self._write() as conn:
            conn.execute("UPDATE attempts SET reason = ? WHERE id = ?", (reason, attempt_id))

    def add_spend(
        self,
        attempt_id: int,
        usd: float,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        steps: int = 0,
        seq: int | None = None,
    ) -> bool:
        """Add to an attempt's (and its run's) spend, tokens and steps, from any process; a non-finite,
        negative or absurd amount is refused (StellaError). With seq, a re-delivered report adds nothing."""
        try:
            usd, input_tokens, output_tokens, steps = check_report(usd, input_tokens, output_tokens, steps)
        except ValueError as exc:
            raise StellaError(f"refused a spend report for attempt {attempt_id}: {exc}") from None
        with self._write() as conn:
            row = conn.execute("SELECT run_id FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row is None:
                raise StellaError(f"no attempt {attempt_id} in the fleet ledger {self.path}")
            run_id = row[0]
            cursor = conn.execute(
                "INSERT INTO spend_events (attempt_id, run_id, usd, input_tokens, output_tokens, at_ms, seq)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (attempt_id, run_id, usd, input_tokens, output_tokens, self._now_ms(), seq),
            )
            if cursor.rowcount == 0:
                return False  # this seq was recorded before
            conn.execute(
                "UPDATE attempts SET spend_usd = spend_usd + ?, input_tokens = input_tokens + ?,"
                " output_tokens = output_tokens + ?, steps = steps + ? WHERE id = ?",
                (usd, input_tokens, output_tokens, steps, attempt_id),
            )
            conn.execute("UPDATE runs SET spend_usd = spend_usd + ? WHERE id = ?", (usd, run_id))
        return True

    def finish_attempt(
        self,
        attempt_id: int,
        *,
        outcome: AttemptOutcome,
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
        stored = _check_choice("attempt outcome", outcome, ATTEMPT_OUTCOMES)
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
                    stored,
                    1 if outcome == AttemptOutcome.SUCCEEDED else 0,
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
                (stored, reason, row[0], row[1]),
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
        state: CIState,
        conclusion: str | None,
        reason: str | None,
        run_urls: list[str],
    ) -> None:
        stored = _check_choice("CI state", state, CI_STATES)
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
                    stored,
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
