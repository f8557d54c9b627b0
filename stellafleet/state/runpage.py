"""The run page's first view from narrow queries (bars as parallel arrays), and one attempt opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.proc.pids import pid_alive
from stellafleet.state import dashboard, views
from stellafleet.state.ledger import Ledger
from stellafleet.state.views import Alive

# Up to this many tasks the first view carries every task card; above it the list is folded.
FOLD_TASKS_OVER = 60
BAR_FIELDS = ("attempt", "task", "lane", "start_ms", "end_ms", "outcome")


def _read_detail(reads: Ledger, run_id: str, *, now_ms: int, alive: Alive) -> dict[str, Any]:
    """views.read_run of the run: whole for a small run, else narrow (with failed tasks' last errors)."""
    if reads.tasks.count(run_id) <= FOLD_TASKS_OVER:
        return views.read_run(reads, run_id, now_ms=now_ms, alive=alive)
    record = {**reads.first_view_record(run_id), "run": reads.runs.get(run_id)}
    detail = views.read_run(reads, run_id, now_ms=now_ms, alive=alive, record=record)
    failing = [
        task["attempts"][-1]
        for wave in detail["waves"]
        for task in wave["tasks"]
        if task["status"] in dashboard.FAILING and task["attempts"]
    ]
    errors = reads.attempts.errors([attempt["id"] for attempt in failing])
    for attempt in failing:
        attempt["error"] = errors.get(attempt["id"])
    return detail


def load_first_view(
    ledger_path: Path, ref: str | None, *, now_ms: int, alive: Alive = pid_alive
) -> dict[str, Any]:
    """GET /api/runs/<ref>/page: the run's first view; UnknownRun when no run matches ref."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        detail = _read_detail(reads, views.resolve_run(reads, ref), now_ms=now_ms, alive=alive)
        shown = dashboard.pictures(reads, detail, now_ms=now_ms)
    tasks_total = sum(len(wave["tasks"]) for wave in detail["waves"])
    waves = None
    if tasks_total <= FOLD_TASKS_OVER:
        waves = detail["waves"]
        dashboard.trim_attempts(waves)
    bars, spend = shown["timeline"]["bars"], shown["spend"]
    points = spend.pop("points")
    return {
        "run": detail["run"],
        "now_ms": now_ms,
        "timeline": {
            **shown["timeline"],
            "bars": {field: [bar[field] for bar in bars] for field in BAR_FIELDS},
        },
        "graph": shown["graph"],
        "spend": {"t_ms": [int(p[0]) for p in points], "usd": [p[1] for p in points], **spend},
        "attention": shown["attention"],
        "branches": detail["branches"],
        "commits": detail["commits"],
        "cleanups": detail["cleanups"],
        "limits": detail["limits"],
        "tasks_total": tasks_total,
        "waves": waves,
    }


def load_attempt(
    ledger_path: Path, attempt_id: int, *, now_ms: int, alive: Alive = pid_alive
) -> dict[str, Any] | None:
    """GET /api/attempts/<id>: the attempt, its task, commits and branch's CI; None when there is none."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        found = reads.attempt_record(attempt_id)
        raw_run = reads.runs.get(found["attempt"]["run_id"]) if found else None
    if found is None or raw_run is None:
        return None
    live = views.run_row(raw_run, now_ms=now_ms, alive=alive)["live"]
    attempt = found["attempt"]
    duration = views.attempt_duration_ms(attempt["started_at_ms"], attempt["finished_at_ms"], now_ms, live)
    shown = {**dashboard.page_fields(attempt), "duration_ms": duration}
    if attempt.get("salvage_sha"):
        shown["salvage_restore"] = views.salvage_restore(str(attempt["salvage_sha"]))
    return {
        "attempt": shown,
        "task": found["task"],
        "commits": found["commits"],
        "ci": found["ci"],
        "run": {"id": raw_run["id"], "live": live},
        "now_ms": now_ms,
    }
