"""The run page as data: its pictures laid out once (the page only maps numbers to pixels), its lean first
view (bars as parallel arrays) and one attempt opened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stellafleet.core.status import AttemptOutcome, FollowUpReason, TaskStatus, outcome_detail
from stellafleet.proc.pids import pid_alive
from stellafleet.state import views
from stellafleet.state.ledger import Ledger

# A running attempt with no sign of life (spend, progress, log growth) for this long needs attention.
QUIET_AFTER_MS = 120_000
SPEND_POINTS = 300
SPARK_POINTS = 24
TOP_SPENDERS = 15
# Attempt columns the page does not use: the commit token's hash in particular never leaves the server.
PAGE_OMITS = ("token_sha256", "run_id", "success", "cpu_seconds", "peak_rss_bytes")
# Task states that stop their dependents (a skip names the first of these it finds upstream).
FAILING = frozenset(
    {TaskStatus.FAILED, TaskStatus.INTERRUPTED, AttemptOutcome.STALLED, AttemptOutcome.ABANDONED}
)


def worker_lanes(attempts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Greedy slots by start time, per node: an attempt takes the lowest slot free when it starts."""
    order = sorted(attempts, key=lambda a: (a["started_at_ms"], a["id"]))
    slot_ends: dict[str, list[float]] = {}
    placed: dict[int, tuple[str, int]] = {}
    for attempt in order:
        ends = slot_ends.setdefault(attempt.get("node") or "", [])
        start = attempt["started_at_ms"]
        end = attempt["finished_at_ms"] if attempt["finished_at_ms"] is not None else float("inf")
        slot = next((i for i, busy_until in enumerate(ends) if busy_until <= start), len(ends))
        ends[slot : slot + 1] = [end]  # a new slot when every one is busy
        placed[attempt["id"]] = (attempt.get("node") or "", slot)
    lanes: list[dict[str, Any]] = []
    index: dict[tuple[str, int], int] = {}
    for node, ends in slot_ends.items():  # nodes in the order they first ran something
        for slot in range(len(ends)):
            index[(node, slot)] = len(lanes)
            label = f"{node} · slot {slot + 1}" if node else f"slot {slot + 1}"
            lanes.append({"node": node or None, "slot": slot + 1, "label": label})
    return lanes, {attempt_id: index[key] for attempt_id, key in placed.items()}


def timeline(detail: dict[str, Any], *, now_ms: int) -> dict[str, Any]:
    """One lane per worker slot, one bar per attempt (end None while it runs), each wave's first start."""
    run = detail["run"]
    tasks = [task for wave in detail["waves"] for task in wave["tasks"]]
    attempts = sorted(
        (a for task in tasks for a in task["attempts"]), key=lambda a: (a["started_at_ms"], a["id"])
    )
    lanes, lane_of = worker_lanes(attempts)  # already in start order: its sort is one pass
    bars = [
        {
            "attempt": a["id"],
            "number": a["number"],
            "task": a["task_id"],
            "lane": lane_of[a["id"]],
            "start_ms": a["started_at_ms"],
            "end_ms": a["finished_at_ms"],
            "outcome": a["outcome"],
        }
        for a in attempts
    ]
    wave_starts: dict[int, int] = {}
    for task in tasks:
        starts = [a["started_at_ms"] for a in task["attempts"]]
        if task["wave"] is not None and starts:
            wave_starts[task["wave"]] = min(wave_starts.get(task["wave"], starts[0]), *starts)
    end = run["finished_at_ms"] or (now_ms if run["live"] else None)
    latest = max([b["end_ms"] or b["start_ms"] for b in bars], default=run["created_at_ms"])
    return {
        "start_ms": run["created_at_ms"],
        "end_ms": max(end or latest, latest),
        "lanes": lanes,
        "bars": bars,
        "waves": [{"wave": w, "start_ms": ms} for w, ms in sorted(wave_starts.items())],
    }


def _cause(task_id: str, by_id: dict[str, dict[str, Any]], seen: set[str]) -> list[str]:
    """The dependency chain from a skipped task up to the failure that caused it (cause first)."""
    seen.add(task_id)
    for dep in by_id[task_id].get("depends_on") or []:
        upstream = by_id.get(dep)
        if upstream is None or dep in seen:
            continue
        if upstream["status"] in FAILING:
            return [dep, task_id]
        if upstream["status"] == TaskStatus.SKIPPED:
            chain = _cause(dep, by_id, seen)
            if chain:
                return [*chain, task_id]
    return []


def graph(detail: dict[str, Any]) -> dict[str, Any]:
    """The plan's DAG by waves, nodes near their dependencies; a skipped task's chain back to its cause."""
    columns = [wave["tasks"] for wave in detail["waves"]]
    by_id = {task["id"]: task for tasks in columns for task in tasks}
    if any(task.get("parent") for task in by_id.values()):
        columns = grown_columns(list(by_id.values()))
    row_of: dict[str, float] = {}
    nodes = []
    for col, tasks in enumerate(columns):

        def pull(task: dict[str, Any]) -> float:  # barycentre of its dependencies: fewer crossings
            rows = [row_of[d] for d in task.get("depends_on") or [] if d in row_of]
            return sum(rows) / len(rows) if rows else float("inf")

        ordered = sorted(enumerate(tasks), key=lambda item: (pull(item[1]), item[0]))
        for row, (_, task) in enumerate(ordered):
            row_of[task["id"]] = row
            chain = _cause(task["id"], by_id, set()) if task["status"] == TaskStatus.SKIPPED else []
            nodes.append(
                {
                    "id": task["id"],
                    "title": task.get("title") or "",
                    "status": task["status"],
                    "wave": task["wave"],
                    "parent": task.get("parent"),  # emitted by that expanding task (listed under it)
                    "expands": bool(task.get("expands")),
                    "col": col,
                    "row": row,
                    "attempt": task["attempts"][-1]["id"] if task["attempts"] else None,
                    "caused_by": chain[0] if chain else None,
                    "cause_chain": chain,
                }
            )
    chained = {
        (a, b) for node in nodes for a, b in zip(node["cause_chain"], node["cause_chain"][1:], strict=False)
    }
    edges = [
        {"from": dep, "to": task_id, "cause": (dep, task_id) in chained}
        for task_id, task in by_id.items()
        for dep in task.get("depends_on") or []
        if dep in by_id
    ]
    edges += [  # an expanding task to what it emitted
        {"from": task["parent"], "to": task_id, "cause": False, "emitted": True}
        for task_id, task in by_id.items()
        if task.get("parent") in by_id
    ]
    return {
        "columns": len(columns),
        "rows": max((len(t) for t in columns), default=0),
        "nodes": nodes,
        "edges": edges,
    }


def grown_columns(tasks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A grown plan's columns: each task after its dependencies, its parent, and all they emitted."""
    by_id = {task["id"]: task for task in tasks}
    emitted: dict[str, list[str]] = {}
    for task in tasks:
        if task.get("parent") in by_id:
            emitted.setdefault(task["parent"], []).append(task["id"])
    column: dict[str, int] = {}

    def after(task_id: str) -> list[str]:  # what a dependent of task_id waits for: it and all it emitted
        return [task_id, *(d for child in emitted.get(task_id, []) for d in after(child))]

    def place(task_id: str) -> int:
        if task_id not in column:
            column[task_id] = 0  # a guard: a recorded graph has no cycle
            task = by_id[task_id]
            waits = [d for dep in task.get("depends_on") or [] if dep in by_id for d in after(dep)]
            waits += [task["parent"]] if task.get("parent") in by_id else []
            column[task_id] = max((place(d) + 1 for d in waits), default=0)
        return column[task_id]

    columns: list[list[dict[str, Any]]] = []
    for task in tasks:
        col = place(task["id"])
        columns.extend([] for _ in range(col + 1 - len(columns)))
        columns[col].append(task)
    return columns


def spend(detail: dict[str, Any], buckets: list[tuple[int, float]], start_ms: int) -> dict[str, Any]:
    """Cumulative dollars over time (ending at the run's total) and the tasks that spent the most."""
    points: list[list[float]] = [[start_ms, 0.0]]
    total = 0.0
    for at_ms, usd in buckets:
        total += usd
        points.append([at_ms, round(total, 6)])
    tasks = sorted(
        (
            {"task": t["id"], "usd": t["spend_usd"]}
            for w in detail["waves"]
            for t in w["tasks"]
            if t["spend_usd"]
        ),
        key=lambda entry: -entry["usd"],
    )
    rest = tasks[TOP_SPENDERS:]
    return {
        "points": points,
        "total_usd": round(total, 6),
        "limit_usd": detail["run"]["spend_limit_usd"],
        "per_task": tasks[:TOP_SPENDERS],
        "others": {"tasks": len(rest), "usd": round(sum(e["usd"] for e in rest), 6)},
    }


def _log_mtime_ms(path: str | None) -> int:
    try:
        return int(Path(path).stat().st_mtime * 1000) if path else 0
    except OSError:
        return 0


def attention(detail: dict[str, Any], last_spend: dict[int, int], *, now_ms: int) -> list[dict[str, Any]]:
    """Running attempts gone quiet, failed tasks, isolated tasks with no commit, red CI; most urgent first."""
    items: list[dict[str, Any]] = []
    tasks = [task for wave in detail["waves"] for task in wave["tasks"]]
    for task in tasks:
        for a in task["attempts"]:
            if a["outcome"] != AttemptOutcome.RUNNING or not detail["run"]["live"]:
                continue
            signs = (a["started_at_ms"], a.get("last_progress_ms") or 0, last_spend.get(a["id"], 0))
            last = max(*signs, _log_mtime_ms(a.get("log_path")))
            if now_ms - last >= QUIET_AFTER_MS:
                items.append(
                    {"kind": "quiet", "task": task["id"], "attempt": a["id"], "since_ms": last, "text": ""}
                )
    needs_you = detail.get("needs_you", ())  # the ledger's needs_you rows, shown in task order
    items[:0] = parked_items(needs_you)  # the "needs you" lane: questions and permissions first
    items += _waiting_items(detail["run"], tasks, needs_you)
    for task in tasks:
        if task.get("no_commits"):
            last_attempt = task["attempts"][-1]
            items.append(
                {
                    "kind": "no_commits",
                    "task": task["id"],
                    "attempt": last_attempt["id"],
                    "status": task["status"],
                    "text": "succeeded with no commit: nothing of it to merge or check",
                }
            )
    red = {row["branch"] for row in needs_you if row["reason"] == FollowUpReason.CI_FIX}
    for ci in detail["ci"]:
        if ci["branch"] in red:
            task = next((t for t in tasks if t["id"] == ci.get("task_id")), None)
            items.append(
                {
                    "kind": "red_ci",
                    "task": ci.get("task_id"),
                    "attempt": task["attempts"][-1]["id"] if task and task["attempts"] else None,
                    "branch": ci["branch"],
                    "pr_url": ci.get("pr_url"),
                    "text": ci.get("conclusion") or ci.get("reason") or "",
                }
            )
    return items


def _waiting_items(
    run: dict[str, Any], tasks: list[dict[str, Any]], needs_you: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tasks that wait on a person: a killed fleet's once, then each failed one."""
    items: list[dict[str, Any]] = []
    waiting = {
        row["task_id"]
        for row in needs_you
        if row["reason"] not in (FollowUpReason.CI_FIX, FollowUpReason.ANSWER)
    }
    failing = [task for task in tasks if task["id"] in waiting]
    abandoned = [
        t for t in failing if t["attempts"] and t["attempts"][-1]["outcome"] == AttemptOutcome.ABANDONED
    ]
    if abandoned:
        items.append(_abandoned_item(run, abandoned))
    for task in failing:
        if task not in abandoned:
            ended = task["attempts"][-1] if task["attempts"] else {}
            # the error with the worker's own words after it (git's message after `exit status 128`)
            said = outcome_detail(task["status"], ended.get("summary"), ended.get("error"))
            text = " ".join((said or task.get("reason") or "").split())
            items.append(
                {
                    "kind": "failed",
                    "task": task["id"],
                    "attempt": ended.get("id"),
                    "status": task["status"],
                    "text": text if len(text) <= 300 else text[:299] + "…",
                }
            )
    return items


def parked_items(needs_you: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each parked task's question or tool request, with the command that answers it."""
    return [
        {
            "kind": "parked",
            "task": row["task_id"],
            "attempt": row["from_attempt_id"],
            "status": TaskStatus.PARKED,
            "item": row["id"],
            "text": " ".join(str(row["context"] or "").split())[:300] + f" (stella answer {row['id']})",
        }
        for row in needs_you
        if row["reason"] == FollowUpReason.ANSWER
    ]


def _abandoned_item(run: dict[str, Any], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """A killed fleet's tasks, once: why they were abandoned, where their work went, how to go on."""
    saved = sum(1 for t in tasks if t["attempts"][-1].get("salvage_sha"))
    ids = ", ".join(t["id"] for t in tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    why = tasks[0]["attempts"][-1].get("error") or run.get("reason") or "the fleet ended"
    go_on = f"`stella fleet --resume {run['id']}"
    if saved:
        go_on = f"the unfinished work of {saved} of them was salvaged: {go_on} --from-salvage` continues it"
    else:
        go_on += "` runs them again"
    text = f"{why} ({ids}); {go_on}"
    first = tasks[0]
    return {"kind": "abandoned", "task": first["id"], "attempt": first["attempts"][-1]["id"],
            "status": first["status"], "count": len(tasks), "text": text}  # fmt: skip


def page_fields(attempt: dict[str, Any]) -> dict[str, Any]:
    """An attempt as the page gets it: without the columns it never shows and without empty fields."""
    return {key: value for key, value in attempt.items() if value is not None and key not in PAGE_OMITS}


def trim_attempts(waves: list[dict[str, Any]]) -> None:
    """Every task card's attempts as the page gets them (page_fields): what it never shows stays here."""
    for wave in waves:
        for task in wave["tasks"]:
            task["attempts"] = [page_fields(attempt) for attempt in task["attempts"]]


def pictures(reads: Ledger, detail: dict[str, Any], *, now_ms: int) -> dict[str, Any]:
    """The run page's timeline, graph, spend and attention for a read_run (before trim_attempts)."""
    shown = timeline(detail, now_ms=now_ms)
    running = [b["attempt"] for b in shown["bars"] if b["outcome"] == AttemptOutcome.RUNNING]
    buckets = reads.spend.buckets(
        detail["run"]["id"], start_ms=shown["start_ms"], end_ms=shown["end_ms"], points=SPEND_POINTS
    )
    return {
        "timeline": shown,
        "graph": graph(detail),
        "spend": spend(detail, buckets, shown["start_ms"]),
        "attention": attention(detail, reads.spend.last_ms_of(running), now_ms=now_ms),
    }


def load_run_page(
    ledger_path: Path, ref: str | None, *, now_ms: int, alive: views.Alive = pid_alive
) -> dict[str, Any]:
    """views.load_run (the same document `stella runs RUN --json` prints) plus the run page's pictures."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        detail = views.read_run(reads, views.resolve_run(reads, ref), now_ms=now_ms, alive=alive)
        detail.update(pictures(reads, detail, now_ms=now_ms))
    trim_attempts(detail["waves"])
    return detail


# Up to this many tasks the first view carries every task card; above it the list is folded.
FOLD_TASKS_OVER = 60
BAR_FIELDS = ("attempt", "number", "task", "lane", "start_ms", "end_ms", "outcome")


def _read_detail(reads: Ledger, run_id: str, *, now_ms: int, alive: views.Alive) -> dict[str, Any]:
    """views.read_run of the run: whole for a small run, else narrow (with failed tasks' last errors)."""
    if reads.tasks.count(run_id) <= FOLD_TASKS_OVER:
        return views.read_run(reads, run_id, now_ms=now_ms, alive=alive)
    record = reads.get_run(run_id, first_view=True)
    detail = views.read_run(reads, run_id, now_ms=now_ms, alive=alive, record=record)
    failing = [
        task["attempts"][-1]
        for wave in detail["waves"]
        for task in wave["tasks"]
        if task["status"] in FAILING and task["attempts"]
    ]
    errors = reads.attempts.errors([attempt["id"] for attempt in failing])
    for attempt in failing:
        attempt["error"] = errors.get(attempt["id"])
    return detail


def load_first_view(
    ledger_path: Path, ref: str | None, *, now_ms: int, alive: views.Alive = pid_alive
) -> dict[str, Any]:
    """GET /api/runs/<ref>/page: the run's first view; UnknownRun when no run matches ref."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        detail = _read_detail(reads, views.resolve_run(reads, ref), now_ms=now_ms, alive=alive)
        shown = pictures(reads, detail, now_ms=now_ms)
    tasks_total = sum(len(wave["tasks"]) for wave in detail["waves"])
    waves = None
    if tasks_total <= FOLD_TASKS_OVER:
        waves = detail["waves"]
        trim_attempts(waves)
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
        **{key: detail[key] for key in ("branches", "commits", "cleanups", "limits", "merge_batches")},
        "tasks_total": tasks_total,
        "waves": waves,
    }


def load_attempt(
    ledger_path: Path, attempt_id: int, *, now_ms: int, alive: views.Alive = pid_alive
) -> dict[str, Any] | None:
    """GET /api/attempts/<id>: the attempt, its task, commits, checks and branch's CI; None when none."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        found = reads.attempt_record(attempt_id)
        raw_run = reads.runs.get(found["attempt"]["run_id"]) if found else None
    if found is None or raw_run is None:
        return None
    live = views.run_row(raw_run, now_ms=now_ms, alive=alive)["live"]
    return {
        "attempt": views.timed_attempt(page_fields(found["attempt"]), now_ms=now_ms, live=live),
        "task": found["task"],
        "commits": found["commits"],
        "checks": [views.check_view(row) for row in found["checks"]],
        "ci": found["ci"],
        "run": {"id": raw_run["id"], "live": live},
        "now_ms": now_ms,
    }
