"""The run page's first view, and one attempt opened on it.

The full run document (dashboard.load_run_page, what `stella runs RUN --json` prints plus the pictures)
carries every attempt's summary, error, paths and tokens: for a run of 2,000 attempts that is over a
megabyte the page would fetch and parse before drawing anything. The first view needs far less: the
header, one bar per attempt, the plan graph, the spend steps and what needs attention. This builds just
that from narrow queries, with the bars as parallel arrays (one list per field, not one object per
attempt); an attempt's details come from load_attempt when it is opened. A run small enough that the
page lists its task cards straight away (FOLD_TASKS_OVER) is read whole and keeps its waves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.proc.pids import pid_alive
from stellafleet.state import dashboard, views
from stellafleet.state.ledger import Ledger
from stellafleet.state.views import Alive

# Up to this many tasks the page shows every task card at once, so their details come with the first view;
# above it the task list is folded and its cards come from the full document when it is opened.
FOLD_TASKS_OVER = 60
BAR_FIELDS = ("attempt", "task", "lane", "start_ms", "end_ms", "outcome")


def _read_detail(reads: Ledger, run_id: str, *, now_ms: int, alive: Alive) -> dict[str, Any]:
    """views.read_run of the run: from the whole record for a small run, else from the narrow one
    (with the errors of the failed tasks' last attempts, which the attention strip quotes)."""
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
    """GET /api/runs/<ref>/page: the run's header, timeline, graph, spend, attention, branches, commits
    and clean-ups; `waves` (the task cards) only for a run of at most FOLD_TASKS_OVER tasks, else None.
    UnknownRun when no run matches ref."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        detail = _read_detail(reads, views.resolve_run(reads, ref), now_ms=now_ms, alive=alive)
        shown = dashboard.pictures(reads, detail, now_ms=now_ms)
    tasks_total = sum(len(wave["tasks"]) for wave in detail["waves"])
    waves = None
    if tasks_total <= FOLD_TASKS_OVER:
        waves = detail["waves"]
        dashboard.trim_attempts(waves)
    # the bars and the spend steps as parallel lists, one per field: field names once, not once per row
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
    """GET /api/attempts/<id>: the attempt's fields (summary, error, tokens, branch, paths...), its task,
    the commits it made and its branch's CI; None when the ledger has no such attempt."""
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
