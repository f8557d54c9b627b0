"""The ledger's `runs` and `tasks` tables: one row per fleet run, one per task of a run's plan."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.status import AttemptOutcome, RunStatus, TaskStatus
from stellafleet.state.ledger_schema import check_choice
from stellafleet.state.sqlitefile import Table

NEWEST_FIRST = "ORDER BY created_at_ms DESC, id DESC"


def no_commits(task: Mapping[str, Any]) -> bool:
    """A succeeded task that ran and has no commit (on its branch, or in the shared tree): worth flagging."""
    ran = task.get("status") == TaskStatus.SUCCEEDED and bool(task.get("attempts"))
    return ran and not task.get("commits")


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
    def base(self) -> str: ...
    @property
    def pipeline(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def expands(self) -> bool: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def check(self) -> str | None: ...
    @property
    def check_timeout(self) -> float: ...


RESUMERS = "SELECT id, status, pid, created_at_ms FROM runs WHERE resumed_from = ? ORDER BY created_at_ms, id"


def _resumers(rows: Iterable[Any]) -> list[tuple[str, bool]]:
    """(id, still running) of each run that resumed a run, oldest first, from RESUMERS' rows."""
    # psutil only here, so a worker opening the ledger starts without it
    from stellafleet.proc.pids import pid_alive

    return [(str(row[0]), row[1] == RunStatus.RUNNING and pid_alive(row[2], row[3])) for row in rows]


def refuse_resumed(run_id: str, resumers: list[tuple[str, bool]]) -> None:
    """`stella fleet --resume` is exclusive: a run is resumed once, by one live fleet at a time."""
    live = [rid for rid, running in resumers if running]
    if live:
        raise StellaError(
            f"run {run_id} is being resumed by run {live[-1]}, which is still running: wait for it to end, "
            "or add --force to resume it again anyway (its tasks would run twice)",
            exit_code=EXIT_USAGE,
        )
    if resumers:
        last = resumers[-1][0]
        raise StellaError(
            f"run {run_id} was already resumed by run {last}: resume that one (`stella fleet --resume "
            f"{last}`), or add --force to resume {run_id} again anyway",
            exit_code=EXIT_USAGE,
        )


class Runs(Table):
    """The runs table: a run's settings, status, lineage and total spend."""

    def create(
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
        resumes: str | None = None,
        force: bool = False,
    ) -> None:
        """The run's row. resumes: the run it resumes, refused (in the same transaction, so two resumes
        started at once cannot both pass) when another run resumed or is resuming it, unless force."""
        values = (plan_path, plan_sha256, base_ref, base_commit, max_concurrency, spend_limit_usd, pipeline)
        started = (run_id, self._db.now_ms(), str(RunStatus.RUNNING))
        with self._db.write() as conn:
            if resumes is not None and not force:
                refuse_resumed(resumes, _resumers(conn.execute(RESUMERS, (resumes,)).fetchall()))
            try:
                conn.execute(
                    "INSERT INTO runs (id, created_at_ms, status, plan_path, plan_sha256, base_ref,"
                    " base_commit, max_concurrency, spend_limit_usd, pipeline, argv, root, pid, resumed_from)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*started, *values, json.dumps(argv), root, pid, resumes),
                )
            except sqlite3.IntegrityError:
                raise StellaError(f"run {run_id} is already in the ledger {self._db.path}") from None

    def check_resumable(self, run_id: str) -> None:
        """StellaError naming the run that resumed (or is resuming) run_id, if there is one."""
        refuse_resumed(run_id, _resumers(self._db.read(RESUMERS, (run_id,))))

    def finish(self, run_id: str, status: RunStatus, *, exit_code: int, reason: str | None = None) -> None:
        stored = check_choice("run status", status, RunStatus)
        self._db.execute(
            "UPDATE runs SET status = ?, finished_at_ms = ?, exit_code = ?, reason = ? WHERE id = ?",
            (stored, self._db.now_ms(), exit_code, reason, run_id),
        )

    def set_lineage(self, run_id: str, *, schedule: str, resumed_from: str | None = None) -> None:
        """Which schedule the run uses and the run it resumes (`stella fleet --resume`), if any."""
        self._db.execute(
            "UPDATE runs SET schedule = ?, resumed_from = ? WHERE id = ?",
            (schedule, resumed_from, run_id),
        )

    def set_executor(self, run_id: str, executor: str) -> None:
        self._db.execute("UPDATE runs SET executor = ? WHERE id = ?", (executor, run_id))

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._db.row("SELECT * FROM runs WHERE id = ?", (run_id,))

    def of_pid(self, pid: int) -> str | None:
        """The newest run the process pid started (this process's own run, once it ran one)."""
        row = self._db.row(
            "SELECT id FROM runs WHERE pid = ? ORDER BY created_at_ms DESC, id DESC LIMIT 1", (pid,)
        )
        return str(row["id"]) if row is not None else None

    def latest_id(self) -> str | None:
        rows = self._db.read(f"SELECT id FROM runs {NEWEST_FIRST} LIMIT 1")
        return str(rows[0][0]) if rows else None

    def resolve(self, ref: str | None) -> str:
        """A full run id from None/"latest", an exact id, or a unique prefix; StellaError otherwise."""
        if ref is None or ref == "latest":
            latest = self.latest_id()
            if latest is None:
                raise StellaError(
                    f"no fleet runs recorded in {self._db.path} yet: start one with `stella fleet`"
                )
            return latest
        if self._db.read("SELECT 1 FROM runs WHERE id = ?", (ref,)):
            return ref
        found = self._db.read(
            "SELECT id FROM runs WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 6", (len(ref), ref)
        )
        matches = [str(row[0]) for row in found]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise StellaError(f"no run matches {ref!r}: `stella runs` lists the recorded runs")
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise StellaError(f"{ref!r} matches several runs ({shown}): give more of the run id")

    def lineage(self, run_id: str) -> list[str]:
        """run_id and the runs it resumes, newest first (each `--resume` of the one before)."""
        chain = [run_id]
        while (row := self.get(chain[-1])) is not None and row.get("resumed_from") not in (None, *chain):
            chain.append(str(row["resumed_from"]))
        return chain

    def resumed_by(self, run_id: str) -> list[str]:
        """The runs that resumed this one (`stella fleet --resume`), oldest first."""
        return [str(row[0]) for row in self._db.read(RESUMERS, (run_id,))]

    def count(self) -> int:
        return int(self._db.read("SELECT count(*) FROM runs")[0][0])

    def page(self, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """A page of runs, newest first, each with its task counts by status, attempt count and duration."""
        runs = self._db.rows(
            "SELECT *, finished_at_ms - created_at_ms AS duration_ms,"
            " (SELECT count(*) FROM attempts a WHERE a.run_id = runs.id) AS attempts_total"
            f" FROM runs {NEWEST_FIRST} LIMIT ? OFFSET ?",
            (limit, offset),
        )
        ids = json.dumps([run["id"] for run in runs])
        counts: dict[str, dict[str, int]] = {run["id"]: {} for run in runs}
        in_page = "run_id IN (SELECT value FROM json_each(?))"
        for row in self._db.read(
            f"SELECT run_id, status, count(*) FROM tasks WHERE {in_page} GROUP BY run_id, status", (ids,)
        ):
            counts[row[0]][row[1]] = int(row[2])
        ci: dict[str, dict[str, int]] = {run["id"]: {} for run in runs}  # watched branches by CI state
        for row in self._db.read(
            f"SELECT run_id, state, count(*) FROM ci WHERE {in_page} GROUP BY run_id, state", (ids,)
        ):
            ci[row[0]][row[1]] = int(row[2])
        flagged: dict[str, list[str]] = {run["id"]: [] for run in runs}
        for task in self._db.rows(
            "SELECT t.run_id, t.id, t.status, t.isolation,"
            " EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = t.run_id AND a.task_id = t.id) AS attempts,"
            " EXISTS (SELECT 1 FROM commits c WHERE c.run_id = t.run_id AND c.task_id = t.id) AS commits"
            f" FROM tasks t WHERE t.{in_page} AND t.status = ? ORDER BY t.rowid",
            (ids, str(TaskStatus.SUCCEEDED)),
        ):
            if no_commits(task):
                flagged[task["run_id"]].append(str(task["id"]))
        for run in runs:
            run["no_commits"] = flagged[run["id"]]
            run["task_counts"] = counts[run["id"]]
            run["ci_counts"] = ci[run["id"]]
            run["tasks_total"] = sum(counts[run["id"]].values())
        return runs

    def with_workspaces(self) -> list[str]:
        """Ids of the runs whose tasks or attempts recorded a branch or a worktree, newest first."""
        rows = self._db.read(
            "SELECT id FROM runs WHERE id IN ("
            " SELECT run_id FROM tasks WHERE branch IS NOT NULL OR worktree IS NOT NULL"
            " UNION SELECT run_id FROM attempts WHERE branch IS NOT NULL OR worktree IS NOT NULL)"
            f" {NEWEST_FIRST}"
        )
        return [str(row[0]) for row in rows]


# The columns of a task the run page's first view draws (no prompt, model or claims).
CARD_COLUMNS = (
    "id, title, status, reason, isolation, wave, branch, worktree, depends_on_json, expands, parent_id"
)


class Tasks(Table):
    """The tasks table: a run's plan tasks, their status and their workspace."""

    def add(self, run_id: str, tasks: Iterable[TaskSpec], waves: dict[str, int]) -> None:
        rows = []
        for task in tasks:
            lists = (json.dumps(list(task.depends_on)), json.dumps(list(task.claims)))
            how = (task.isolation, waves.get(task.id), task.pipeline, task.model, task.timeout)
            grown = (int(task.expands), task.parent, task.base, task.check, task.check_timeout)
            rows.append((run_id, task.id, task.title, task.prompt, *lists, *how, *grown))
        with self._db.write() as conn:
            conn.executemany(
                "INSERT INTO tasks (run_id, id, title, prompt, depends_on_json, claims_json, isolation, wave,"
                " pipeline, model, timeout_s, expands, parent_id, base, check_command, check_timeout_s)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def set_fragment(self, run_id: str, task_id: str, fragment_path: str) -> None:
        """The plan fragment an expanding task's worker wrote (its tasks are added with parent_id)."""
        self._db.execute(
            "UPDATE tasks SET fragment_path = ? WHERE run_id = ? AND id = ?",
            (fragment_path, run_id, task_id),
        )

    def set_status(self, run_id: str, task_id: str, status: TaskStatus, reason: str | None = None) -> None:
        stored = check_choice("task status", status, TaskStatus)
        self._db.execute(
            "UPDATE tasks SET status = ?, reason = ? WHERE run_id = ? AND id = ?",
            (stored, reason, run_id, task_id),
        )

    def set_wave(self, run_id: str, task_ids: Iterable[str], wave: int) -> None:
        """The wave the tasks started in (the run's waves are numbered as they start)."""
        with self._db.write() as conn:
            conn.executemany(
                "UPDATE tasks SET wave = ? WHERE run_id = ? AND id = ?",
                [(wave, run_id, task_id) for task_id in task_ids],
            )

    def set_workspace(self, run_id: str, task_id: str, branch: str | None, worktree: str | None) -> None:
        self._db.execute(
            "UPDATE tasks SET branch = ?, worktree = ? WHERE run_id = ? AND id = ?",
            (branch, worktree, run_id, task_id),
        )

    def count(self, run_id: str) -> int:
        return int(self._db.read("SELECT count(*) FROM tasks WHERE run_id = ?", (run_id,))[0][0])

    def of_run(self, run_id: str, columns: str = "*") -> list[dict[str, Any]]:
        """The run's tasks in plan order (by wave), with depends_on (and claims, if read) decoded."""
        query = f"SELECT {columns} FROM tasks WHERE run_id = ? ORDER BY wave, rowid"
        tasks = self._db.rows(query, (run_id,))
        for task in tasks:
            task["depends_on"] = json.loads(task["depends_on_json"] or "[]")
            if "claims_json" in task:
                task["claims"] = json.loads(task["claims_json"] or "[]")
            if columns != "*":
                del task["depends_on_json"]
        return tasks

    def get(self, run_id: str, task_id: str) -> dict[str, Any] | None:
        return self._db.row(
            "SELECT id, title, branch FROM tasks WHERE run_id = ? AND id = ?", (run_id, task_id)
        )

    def succeeded_in(self, run_ids: Sequence[str], task_id: str) -> dict[str, Any] | None:
        """The task's row in the first of run_ids where an attempt of it succeeded (None: in none)."""
        for run_id in run_ids:
            row = self._db.row(
                "SELECT run_id, id, isolation, branch FROM tasks t WHERE run_id = ? AND id = ? AND EXISTS"
                " (SELECT 1 FROM attempts a WHERE a.run_id = t.run_id AND a.task_id = t.id"
                " AND a.outcome = ?)",
                (run_id, task_id, str(AttemptOutcome.SUCCEEDED)),
            )
            if row is not None:
                return row
        return None

    def set_stale(self, run_id: str, task_id: str, why: str | None) -> None:
        """Why the task's branch no longer starts from its parents' work (None: it does again)."""
        self._db.execute("UPDATE tasks SET stale = ? WHERE run_id = ? AND id = ?", (why, run_id, task_id))
