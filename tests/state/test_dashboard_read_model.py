"""The run page's read model: worker-slot lanes, the plan graph's cause chains, spend, needs attention."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.core.status import AttemptEnd, AttemptOutcome, TaskStatus
from stellafleet.state import dashboard, views
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_fleet import RUN_ID, build_sample_fleet
from stellafleet.testing.sample_ledger import (
    StepClock,
    add_run,
    build_sample_ledger,
    leave_for_you,
    sample_task,
)

ALIVE = lambda pid, started: True  # noqa: E731  (every fleet process counts as running)
T0 = 1_796_000_000_000


def attempt(n: int, start: int, end: int | None, node: str | None = None, task: str = "t") -> dict[str, Any]:
    return {"id": n, "task_id": task, "started_at_ms": start, "finished_at_ms": end, "node": node}


def test_lanes_are_greedy_slots_by_start_time_per_node() -> None:
    attempts = [
        attempt(1, 0, 10),
        attempt(2, 1, 5),
        attempt(3, 5, 9),  # slot 2 is free again at 5
        attempt(4, 6, None),  # running: holds its slot for good
        attempt(5, 10, 12),  # slot 1 free at 10
        attempt(6, 11, 13),
        attempt(7, 0, 4, node="gpu-1"),
        attempt(8, 2, 3, node="gpu-1"),
    ]
    lanes, lane_of = dashboard.worker_lanes(attempts)
    labels = [lane["label"] for lane in lanes]
    assert labels == ["slot 1", "slot 2", "slot 3", "gpu-1 · slot 1", "gpu-1 · slot 2"]
    assert [lane_of[n] for n in range(1, 9)] == [0, 1, 1, 2, 0, 1, 3, 4]


def test_sample_run_timeline_graph_spend_and_attention(tmp_path: Path) -> None:
    db = tmp_path / ".stella" / "private" / "fleet.db"
    build_sample_fleet(db, live_pid=1)
    page = dashboard.load_run_page(db, RUN_ID, now_ms=wall_ms(), alive=ALIVE)  # the live run ends now
    with sqlite3.connect(db) as conn:
        attempts = conn.execute("SELECT count(*) FROM attempts").fetchone()[0]
        total = conn.execute("SELECT spend_usd FROM runs").fetchone()[0]
        deps = conn.execute("SELECT sum(json_array_length(depends_on_json)) FROM tasks").fetchone()[0]
    timeline, graph, spend = page["timeline"], page["graph"], page["spend"]
    assert len(timeline["bars"]) == attempts == 15 and len(timeline["lanes"]) == 4
    assert [w["wave"] for w in timeline["waves"]] == [1, 2, 3]
    assert len(graph["nodes"]) == 18 and len(graph["edges"]) == deps
    codegen = next(n for n in graph["nodes"] if n["id"] == "codegen")
    assert codegen["cause_chain"] == ["parser", "ast", "codegen"] and codegen["caused_by"] == "parser"
    assert sorted(e["to"] for e in graph["edges"] if e["cause"]) == ["ast", "codegen", "docs", "errors"]
    assert spend["points"][-1][1] == spend["total_usd"] and abs(spend["total_usd"] - total) < 1e-6
    assert [p[0] for p in spend["points"]] == sorted(p[0] for p in spend["points"])
    assert [(i["kind"], i["task"]) for i in page["attention"]] == [
        ("quiet", "e2e"),
        ("failed", "parser"),
        ("red_ci", "store"),
    ]
    assert all("token_sha256" not in a for w in page["waves"] for t in w["tasks"] for a in t["attempts"])


def test_runs_list_sparkline_ends_at_each_runs_spend(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    build_sample_ledger(db)
    build_sample_fleet(db)
    page = views.runs_page(db, limit=10, offset=0, now_ms=T0 * 2, alive=ALIVE, sparks=dashboard.SPARK_POINTS)
    for run in page["runs"]:
        spark = run["spend_spark"]
        assert len(spark) == dashboard.SPARK_POINTS and spark == sorted(spark)
        assert abs(spark[-1] - run["spend_usd"]) < 1e-6, run["id"]


def test_a_quiet_attempt_needs_attention_until_it_shows_life(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    clock = StepClock(T0)
    with Ledger.open(db, now_ms=clock) as ledger:
        add_run(ledger, "r-1")
        ledger.tasks.add("r-1", [sample_task("a"), sample_task("b", depends_on=("a",))], {"a": 1, "b": 2})
        first = ledger.attempts.start("r-1", "a", pipeline="command", log_path=str(tmp_path / "none.log"))
    quiet_at = T0 + dashboard.QUIET_AFTER_MS
    assert dashboard.load_run_page(db, "r-1", now_ms=quiet_at - 1, alive=ALIVE)["attention"] == []
    items = dashboard.load_run_page(db, "r-1", now_ms=quiet_at, alive=ALIVE)["attention"]
    assert [(i["kind"], i["attempt"], i["since_ms"]) for i in items] == [("quiet", first, T0)]
    clock.advance(60)
    with Ledger.open(db, now_ms=clock) as ledger:
        ledger.spend.add(first, 0.01)  # a sign of life moves the quiet period on
    assert dashboard.load_run_page(db, "r-1", now_ms=quiet_at, alive=ALIVE)["attention"] == []
    dead = dashboard.load_run_page(db, "r-1", now_ms=quiet_at * 2, alive=lambda pid, started: False)
    assert dead["attention"] == []  # a fleet that is gone has no running workers to watch
    with Ledger.open(db, now_ms=clock) as ledger:
        ledger.attempts.finish(
            first, AttemptEnd(outcome=AttemptOutcome.STALLED, exit_code=None, summary="", error="stuck")
        )
        ledger.tasks.set_status("r-1", "b", TaskStatus.SKIPPED, "dependency failed: a")
    page = dashboard.load_run_page(db, "r-1", now_ms=quiet_at, alive=ALIVE)
    assert page["attention"] == []  # a failed task shows once it waits on a person: its needs_you request
    with Ledger.open(db, now_ms=clock) as ledger:
        leave_for_you(ledger, "r-1", "a", "stuck", attempt=first)
    page = dashboard.load_run_page(db, "r-1", now_ms=quiet_at, alive=ALIVE)
    assert [(i["kind"], i["task"], i["text"]) for i in page["attention"]] == [("failed", "a", "stuck")]
    assert next(n for n in page["graph"]["nodes"] if n["id"] == "b")["caused_by"] == "a"


def test_the_page_numbers_attempts_per_task_where_a_person_reads_them(tmp_path: Path) -> None:
    """Bars, task cards and the attempt panel carry the task's own count beside the ledger's id."""
    db = tmp_path / ".stella" / "private" / "fleet.db"
    build_sample_fleet(db, live_pid=1)
    page = dashboard.load_run_page(db, RUN_ID, now_ms=wall_ms(), alive=ALIVE)
    by_task: dict[str, list[int]] = {}
    for bar in sorted(page["timeline"]["bars"], key=lambda b: b["attempt"]):
        by_task.setdefault(bar["task"], []).append(bar["number"])
    assert all(numbers == list(range(1, len(numbers) + 1)) for numbers in by_task.values())
    assert any(len(numbers) > 1 for numbers in by_task.values())  # a retried task counts 1, 2
    last = max(page["timeline"]["bars"], key=lambda b: b["attempt"])
    assert last["attempt"] > last["number"]
    opened = dashboard.load_attempt(db, last["attempt"], now_ms=wall_ms(), alive=ALIVE)
    assert opened is not None and opened["attempt"]["number"] == last["number"]
    first = dashboard.load_first_view(db, RUN_ID, now_ms=wall_ms(), alive=ALIVE)
    assert first is not None and "number" in first["timeline"]["bars"]
