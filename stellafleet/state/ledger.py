"""The fleet ledger, `.stella/private/fleet.db`: one object per table (a public interface: docs/ledger.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import EXIT_INTERRUPTED, StellaError
from stellafleet.core.status import AttemptOutcome, FollowUpReason, RequestState, RunStatus, TaskStatus
from stellafleet.state.ledger_attempts import BAR_COLUMNS, Attempts, History, Limits, Spend
from stellafleet.state.ledger_branches import CI, Checks, Cleanups, Commits, MergeBatches, Merges
from stellafleet.state.ledger_requests import Facts, Requests
from stellafleet.state.ledger_runs import CARD_COLUMNS, Runs, Tasks, TaskSpec
from stellafleet.state.ledger_schema import LEDGER_SCHEMA
from stellafleet.state.sqlitefile import Database, Handle

__all__ = ["Ledger", "TaskSpec"]
# The tables holding a run's rows, as get_run names them.
RUN_TABLES: tuple[str, ...] = ("tasks", "attempts", "commits", "checks", "ci", "cleanups", "merges")
RUN_TABLES += ("merge_batches", "limits", "requests", "facts")


class Ledger(Handle):
    """One open connection to fleet.db, one object per table on it; safe to share between threads."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.path, self.readonly = db.path, db.readonly
        self.runs, self.tasks, self.attempts, self.spend = Runs(db), Tasks(db), Attempts(db), Spend(db)
        self.commits, self.ci, self.cleanups, self.merges = Commits(db), CI(db), Cleanups(db), Merges(db)
        self.limits, self.history, self.checks = Limits(db), History(db), Checks(db)
        self.requests, self.facts = Requests(db), Facts(db)
        self.merge_batches = MergeBatches(db)

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, now_ms: Callable[[], int] = wall_ms) -> Ledger:
        """Open the ledger at path, creating it atomically unless readonly; StellaError if it is not one."""
        return cls(Database(Path(path), LEDGER_SCHEMA, readonly=readonly, now_ms=now_ms))

    def get_run(self, run_id: str, *, first_view: bool = False) -> dict[str, Any]:
        """Everything recorded about one run, or with first_view what the run page draws first, narrow (no
        prompts, summaries, errors, merges or requests but those that need you); StellaError if the ledger
        has no such run. Both hold `needs_you`: the requests that wait on a person."""
        run = self.runs.get(run_id)
        if run is None:
            raise StellaError(f"no run {run_id!r} in {self.path}: `stella runs` lists the recorded runs")
        if not first_view:
            tables = {table: getattr(self, table).of_run(run_id) for table in RUN_TABLES}
            return {"run": run, **tables, "needs_you": self.requests.needing_you(run_id)}
        return {
            "run": run,
            "tasks": self.tasks.of_run(run_id, CARD_COLUMNS),
            "attempts": self.attempts.of_run(run_id, BAR_COLUMNS),
            "commits": self.commits.of_run(
                run_id, "sha, task_id, attempt_id, branch, message, committed_at_ms"
            ),
            **{
                table: getattr(self, table).of_run(run_id)
                for table in ("checks", "ci", "cleanups", "limits", "merge_batches")
            },
            "needs_you": self.requests.needing_you(run_id),
        }

    def attempt_record(self, attempt_id: int) -> dict[str, Any] | None:
        """One attempt opened on the run page: its row, its task, its commits and its branch's CI."""
        attempt = self.attempts.get(attempt_id)
        if attempt is None:
            return None
        run_id = attempt["run_id"]
        task_id = attempt["task_id"]
        task = self.tasks.get(run_id, task_id) or {"id": task_id, "title": None, "branch": None}
        found = (
            self.ci.of_branch(run_id, branch) for branch in (task["branch"], attempt["branch"]) if branch
        )
        return {
            "attempt": {**attempt, "number": self.attempts.number_of(attempt_id)},
            "task": task,
            "commits": self.commits.of_attempt(run_id, attempt_id),
            "checks": self.checks.of_attempt(attempt_id),
            "ci": next((ci for ci in found if ci is not None), None),
        }

    def abandon_run(self, run_id: str, reason: str) -> None:
        """A run whose fleet is gone: its open attempts `abandoned`, their tasks and the run `interrupted`,
        finished when the run last recorded anything (not when a later command found it gone)."""
        running = str(AttemptOutcome.RUNNING)
        unfinished = (str(TaskStatus.RUNNING), str(TaskStatus.PENDING))
        with self._db.write() as conn:
            last = conn.execute(
                "SELECT MAX(x) FROM (SELECT created_at_ms AS x FROM runs WHERE id = ?1"
                " UNION ALL SELECT MAX(MAX(started_at_ms), COALESCE(MAX(finished_at_ms), 0),"
                " COALESCE(MAX(last_progress_ms), 0)) FROM attempts WHERE run_id = ?1"
                " UNION ALL SELECT MAX(at_ms) FROM spend_events WHERE run_id = ?1)",
                (run_id,),
            ).fetchone()[0]
            now = min(int(last), self._db.now_ms()) if last is not None else self._db.now_ms()
            conn.execute(  # each task it cuts short waits on a person: `stella fleet --resume`
                "INSERT INTO requests (run_id, task_id, reason, context, state, asked_by, asked_at_ms,"
                " from_attempt_id) SELECT run_id, id, ?, ?, ?, 'recovery', ?, (SELECT MAX(a.id)"
                " FROM attempts a WHERE a.run_id = tasks.run_id AND a.task_id = tasks.id) FROM tasks"
                " WHERE run_id = ? AND status IN (?, ?)",
                (str(FollowUpReason.RETRY), reason, str(RequestState.NEEDS_YOU), now, run_id, *unfinished),
            )
            conn.execute(
                "UPDATE attempts SET outcome = ?, success = 0, finished_at_ms = ?, error = ?, reason = ?,"
                " summary = COALESCE(summary, ?) WHERE run_id = ? AND outcome = ?",
                (str(AttemptOutcome.ABANDONED), now, reason, reason, "abandoned", run_id, running),
            )
            conn.execute(
                "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND status IN (?, ?)",
                (str(TaskStatus.INTERRUPTED), reason, run_id, *unfinished),
            )
            conn.execute(
                "UPDATE runs SET status = ?, finished_at_ms = ?, exit_code = ?, reason = ?"
                " WHERE id = ? AND status = ?",
                (str(RunStatus.INTERRUPTED), now, EXIT_INTERRUPTED, reason, run_id, str(RunStatus.RUNNING)),
            )

    def seed_attempt(
        self, run_id: str, task_id: str, attempt_id: int, *, isolation: str, token_sha256: str | None
    ) -> None:
        """A remote node's scratch ledger: the one run, task and attempt its worker records against."""
        now = self._db.now_ms()
        with self._db.write() as conn:
            conn.execute("INSERT INTO runs (id, created_at_ms) VALUES (?, ?)", (run_id, now))
            conn.execute(
                "INSERT INTO tasks (run_id, id, isolation, status) VALUES (?, ?, ?, 'running')",
                (run_id, task_id, isolation),
            )
            conn.execute(
                "INSERT INTO attempts (id, run_id, task_id, started_at_ms, token_sha256)"
                " VALUES (?, ?, ?, ?, ?)",
                (attempt_id, run_id, task_id, now, token_sha256),
            )
