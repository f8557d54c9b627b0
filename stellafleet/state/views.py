"""What a reader sees of the ledger, as JSON-ready dicts: the observatory's API and `stella runs --json`."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.status import RunStatus, TaskStatus
from stellafleet.core.terminal import last_line
from stellafleet.proc.pids import pid_alive
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_runs import no_commits

TASK_OUTCOMES = (
    TaskStatus.SUCCEEDED,
    TaskStatus.FAILED,
    TaskStatus.SKIPPED,
    TaskStatus.RUNNING,
    TaskStatus.PENDING,
    TaskStatus.INTERRUPTED,
)
START_HINT = 'stella fleet "Add unit tests for the parser module"'

Alive = Callable[[int | None, int | None], bool]


def _json_list(text: str | None) -> list[Any]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return [text]
    return value if isinstance(value, list) else [value]


def run_row(run: dict[str, Any], *, now_ms: int, alive: Alive = pid_alive) -> dict[str, Any]:
    """One run as the runs list shows it; `live` says whether its numbers can still change."""
    counts = run.get("task_counts") or {}
    tasks = {str(status): int(counts.get(status, 0)) for status in TASK_OUTCOMES}
    tasks["total"] = int(run.get("tasks_total", sum(tasks.values())))
    running = run["status"] == RunStatus.RUNNING
    fleet_alive = alive(run.get("pid"), run.get("created_at_ms")) if running else False
    finished = run.get("finished_at_ms")
    end = finished if finished is not None else (now_ms if fleet_alive else None)
    argv = [str(arg) for arg in _json_list(run.get("argv"))]  # may or may not start with the program name
    typed = shlex.join(argv if Path(argv[0]).name == "stella" else ["stella", *argv]) if argv else None
    return {
        "id": run["id"],
        "status": run["status"],
        "live": fleet_alive,
        # a run still marked running whose fleet process is gone (killed, machine rebooted)
        "stale": running and not fleet_alive,
        "created_at_ms": run["created_at_ms"],
        "finished_at_ms": finished,
        "duration_ms": None if end is None else max(0, end - run["created_at_ms"]),
        "spend_usd": float(run.get("spend_usd") or 0.0),
        **{
            key: run.get(key)
            for key in ("spend_limit_usd", "pipeline", "base_ref", "base_commit", "plan_path")
        },
        "command": typed,  # as the user typed it
        "max_concurrency": run.get("max_concurrency"),
        "schedule": run.get("schedule") or "waves",  # ledgers from before schedules ran in waves
        **{key: run.get(key) for key in ("resumed_from", "exit_code", "reason", "pid")},
        "tasks": tasks,
        # its succeeded tasks with no commit (no_commits below): nothing of theirs to merge
        "no_commits": [str(task_id) for task_id in run.get("no_commits") or ()],
        "attempts_total": run.get("attempts_total"),
        "ci": run.get("ci_counts") or {},  # the watched branches by CI state (empty: not watched)
    }


def runs_page(
    ledger_path: Path, *, limit: int, offset: int, now_ms: int, alive: Alive = pid_alive, sparks: int = 0
) -> dict[str, Any]:
    """A page of runs, newest first; an absent ledger is an empty page that says how to start. sparks:
    each run's cumulative spend as a sparkline of that many points (`spend_spark`, the dashboard's)."""
    page: dict[str, Any] = {
        "ledger": str(ledger_path),
        "ledger_exists": ledger_path.exists(),
        "limit": limit,
        "offset": offset,
        "total": 0,
        "runs": [],
        "now_ms": now_ms,
        "start_hint": START_HINT,
    }
    if not page["ledger_exists"]:
        return page
    with Ledger.open(ledger_path, readonly=True) as ledger:
        page["total"] = ledger.runs.count()
        page["runs"] = [
            run_row(run, now_ms=now_ms, alive=alive) for run in ledger.runs.page(limit=limit, offset=offset)
        ]
        if sparks:
            lines = ledger.spend.sparklines(page["runs"], points=sparks, now_ms=now_ms)
            for run in page["runs"]:
                run["spend_spark"] = lines[run["id"]]
    return page


def timed_attempt(attempt: dict[str, Any], *, now_ms: int, live: bool) -> dict[str, Any]:
    """The attempt with how long it ran (a running one of a live run: until now; of a dead run: unknown),
    its phase while its setup runs and, when salvaged, the command that applies its work uncommitted."""
    start, end = attempt.get("started_at_ms"), attempt.get("finished_at_ms")
    if start is None or (end is None and not live):
        duration = None
    else:
        duration = max(0, (now_ms if end is None else end) - start)
    shown = {**attempt, "duration_ms": duration}
    setup_start = attempt.get("setup_started_ms")
    if end is None and live and setup_start is not None and attempt.get("setup_ms") is None:
        shown["phase"] = "setup"  # its worker starts once the setup is done: the setup's timer and log line
        shown["setup_elapsed_ms"] = max(0, now_ms - setup_start)
        log_path = attempt.get("log_path")
        shown["setup_last_line"] = last_line(Path(log_path)) if log_path else ""
    if "start_parents_json" in attempt:  # a stacked attempt's parents: [{"task": id, "commit": sha}]
        shown["start_parents"] = _json_list(attempt["start_parents_json"])
    if attempt.get("salvage_sha"):
        shown["salvage_restore"] = f"git cherry-pick --no-commit {str(attempt['salvage_sha'])[:12]}"
    return shown


def _branch(name: str, isolation: str | None) -> dict[str, Any]:
    return {"branch": name, "worktree": None, "tasks": [], "isolation": isolation, "commits": 0, "ci": None}


_TASK_KEYS = (
    "id",
    "title",
    "prompt",
    "status",
    "reason",
    "isolation",
    "base",
    "stale",
    "wave",
    "pipeline",
    "model",
    "timeout_s",
    "branch",
    "worktree",
    "depends_on",
    "claims",
    "expands",
    "fragment_path",
)


def check_view(row: dict[str, Any]) -> dict[str, Any]:
    """One check run as readers see it (`checks` of an attempt, of a merge step)."""
    return {
        "phase": row["phase"],
        "command": row["command"],
        "exit_code": row["exit_code"],
        "passed": bool(row["passed"]),
        "duration_ms": row["duration_ms"],
        "commit": row["commit_sha"],
        "output_tail": row["output_tail"],
        "log_path": row["log_path"],
    }


def attempt_sessions(facts: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Attempt id -> its agent's session: id, tokens (its context at the end) and how it started."""
    sessions: dict[int, dict[str, Any]] = {}
    for fact in facts:
        key, value = fact["key"], fact["value"]
        if key == "session" and isinstance(value, dict):
            sessions.setdefault(fact["attempt_id"], {}).update(id=value.get("id"), tokens=value.get("tokens"))
        elif key == "session_start" and isinstance(value, str):
            sessions.setdefault(fact["attempt_id"], {})["start"] = value
    return sessions


def _by_task(rows: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    grouped: dict[str | None, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["task_id"], []).append(row)
    return grouped


def _tasks(record: dict[str, Any], *, now_ms: int, live: bool) -> list[dict[str, Any]]:
    """A run's tasks in the ledger's order, each with its attempts, commits, spend and CI."""
    attempts_by_task = _by_task(record["attempts"])
    commits_by_task = _by_task(record["commits"])
    checks: dict[int | None, list[dict[str, Any]]] = {}
    for row in record.get("checks", []):
        checks.setdefault(row["attempt_id"], []).append(check_view(row))
    ci_by_branch = {entry["branch"]: entry for entry in record["ci"]}
    facts: dict[int, dict[str, Any]] = {}  # what each attempt learned or held (its leased ports, its locks)
    for fact in record.get("facts", []):
        facts.setdefault(fact["attempt_id"], {})[fact["key"]] = fact["value"]
    sessions = attempt_sessions(record.get("facts", []))
    tasks = []
    for task in record["tasks"]:
        attempts = [
            {
                **timed_attempt(a, now_ms=now_ms, live=live),
                "checks": checks.get(a["id"], []),
                "facts": facts.get(a["id"], {}),
                "session": sessions.get(a["id"]),
            }
            for a in attempts_by_task.get(task["id"], [])
        ]
        for number, attempt in enumerate(attempts, start=1):  # the task's own count; `id` is the ledger's
            attempt["number"] = number
        view = {key: task.get(key) for key in _TASK_KEYS}
        view["expands"] = bool(view["expands"])
        view["parent"] = task.get("parent_id")  # the expanding task that emitted it (None: the plan's)
        view["attempts"] = attempts
        view["commits"] = commits_by_task.get(task["id"], [])
        view["no_commits"] = no_commits(view)
        view["spend_usd"] = sum(float(a.get("spend_usd") or 0.0) for a in attempts)
        view["ci"] = ci_by_branch.get(task["branch"]) if task.get("branch") else None
        tasks.append(view)
    return under_parents(tasks)


def under_parents(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks in order, each emitted task right after its parent, each with its depth (0: a plan's)."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    ids = {task["id"] for task in tasks}
    for task in tasks:
        parent = task.get("parent")
        children.setdefault(parent if parent in ids else None, []).append(task)
    ordered: list[dict[str, Any]] = []
    todo = [(task, 0) for task in reversed(children.get(None, []))]
    while todo:
        task, depth = todo.pop()
        task["depth"] = depth
        ordered.append(task)
        todo.extend((child, depth + 1) for child in reversed(children.get(task["id"], [])))
    return ordered


def _branches(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every branch a run touched: its tasks' own, those its commits landed on, and those CI watched."""
    branches: dict[str, dict[str, Any]] = {}

    def branch(name: str, isolation: str | None, task_id: str | None) -> dict[str, Any]:
        entry = branches.setdefault(name, _branch(name, isolation))
        if task_id and task_id not in entry["tasks"]:
            entry["tasks"].append(task_id)
        return entry

    for task in record["tasks"]:
        if task.get("branch"):
            entry = branch(task["branch"], task.get("isolation"), task["id"])
            entry["worktree"] = entry["worktree"] or task.get("worktree")
    for commit in record["commits"]:
        if commit.get("branch"):
            branch(commit["branch"], "shared", commit.get("task_id"))["commits"] += 1
    for ci in record["ci"]:
        branch(ci["branch"], None, ci.get("task_id"))["ci"] = ci
    return list(branches.values())


def run_model(record: dict[str, Any], *, now_ms: int, alive: Alive = pid_alive) -> dict[str, Any]:
    """The read model of one run that `stella runs RUN --json`, the run page and `fleet --json` project."""
    raw_run = record["run"]
    counts = Counter(task["status"] for task in record["tasks"])
    run = run_row(
        {**raw_run, "task_counts": counts, "attempts_total": len(record["attempts"])},
        now_ms=now_ms,
        alive=alive,
    )
    argv = [str(arg) for arg in _json_list(raw_run.get("argv"))]
    run.update(argv=argv, root=raw_run.get("root"), plan_sha256=raw_run.get("plan_sha256"))
    tasks = _tasks(record, now_ms=now_ms, live=run["live"])
    run["no_commits"] = [task["id"] for task in tasks if task["no_commits"]]
    return {
        "run": run,
        "tasks": tasks,
        "branches": _branches(record),
        **{key: record[key] for key in ("commits", "ci", "cleanups")},
        **{key: record.get(key, []) for key in ("merges", "merge_batches", "limits")},
        "needs_you": [{key: row.get(key) for key in NEEDS_YOU_KEYS} for row in record.get("needs_you", [])],
    }


# What a view shows of a request that waits on a person (the ledger's `needs_you` rows, get_run's)
NEEDS_YOU_KEYS = (
    "id",
    "task_id",
    "branch",
    "reason",
    "context",
    "asked_by",
    "asked_at_ms",
    "from_attempt_id",
)


class UnknownRun(StellaError):
    """No run matches the reference; the ledger itself opened fine."""


def resolve_run(ledger: Ledger, ref: str | None) -> str:
    """The id of the run ref names (an id, a unique prefix or "latest"); UnknownRun when there is none."""
    try:
        return ledger.runs.resolve(ref)
    except StellaError as exc:
        raise UnknownRun(str(exc)) from None


def read_run(
    ledger: Ledger, run_id: str, *, now_ms: int, alive: Alive, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One run opened up (`stella runs RUN --json`, the run page): run_model of the run (from record, a
    narrower read of it, if given) with its tasks by wave and the runs resuming it."""
    model = run_model(record or ledger.get_run(run_id), now_ms=now_ms, alive=alive)
    model["run"]["resumed_by"] = ledger.runs.resumed_by(run_id)
    waves: dict[int | None, list[dict[str, Any]]] = {}
    wave_of: dict[str, int | None] = {}
    for task in model.pop("tasks"):  # an emitted task is listed under its parent, in the parent's wave
        wave = wave_of.get(task["parent"], task["wave"]) if task.get("parent") else task["wave"]
        wave_of[task["id"]] = wave
        waves.setdefault(wave, []).append(task)
    ordered = sorted(waves.items(), key=lambda item: (item[0] is None, item[0] or 0))
    return {
        "run": model["run"],
        "waves": [{"wave": wave, "tasks": tasks} for wave, tasks in ordered],
        **model,
        "now_ms": now_ms,
    }


def load_run(ledger_path: Path, ref: str | None, *, now_ms: int, alive: Alive = pid_alive) -> dict[str, Any]:
    """read_run for a run named by id, prefix or "latest"; UnknownRun, or StellaError on a bad ledger."""
    with Ledger.open(ledger_path, readonly=True) as ledger:
        return read_run(ledger, resolve_run(ledger, ref), now_ms=now_ms, alive=alive)
