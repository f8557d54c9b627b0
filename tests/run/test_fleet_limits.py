"""Fleets that respect provider limits: the engine's workers report rate and usage limits to the fleet,
which narrows, holds new starts, and on a far usage limit skips what is left (exit 3, --resume goes on)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from helpers.engine import make_repo
from helpers.enginefleet import configure, plan, scripts
from helpers.fleet import by_id, run_record

from stellafleet.cli import main
from stellafleet.core.paths import StatePaths
from stellafleet.run.control import run_fleet
from stellafleet.run.prepare import FleetOptions
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import RateLimit, ScriptedModelServer, UsageLimit


def limit_rows(root: Path) -> list[dict[str, Any]]:
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.limits.of_run(ledger.runs.resolve(None))


def test_rate_limits_narrow_the_fleet_and_it_recovers_without_a_failed_task(
    tmp_path: Path, isolated_home: Path
) -> None:
    root = make_repo(tmp_path / "repo")
    ids = [f"t{n}" for n in range(1, 7)]
    with ScriptedModelServer(
        [], scripts=scripts(ids), rate_limit=RateLimit(calls=3, retry_after=1.0)
    ) as server:
        configure(root, server)
        code = main(["-C", str(root), "fleet", "--plan", str(plan(root, ids)), "--max-concurrency", "4",
                     "--schedule", "eager"])  # fmt: skip
    record = run_record(root)
    assert code == 0, record["tasks"]
    assert {task["status"] for task in record["tasks"]} == {"succeeded"}
    rows = limit_rows(root)
    rates = [row for row in rows if row["kind"] == "rate"]
    assert len(rates) >= 3 and all(row["source"] == "engine" and row["status"] == 429 for row in rates)
    assert all(row["reset_at_ms"] and row["attempt_id"] for row in rates)
    widths = [row["concurrency"] for row in rows if row["kind"] == "concurrency"]
    low = min(widths)
    assert low < 4, widths  # it narrowed
    assert widths.index(low) < len(widths) - 1 and widths[-1] > low, widths  # and grew back
    assert server.rate_limited >= 3


def test_a_far_usage_limit_skips_what_is_left_exits_3_and_resume_runs_it(
    tmp_path: Path, isolated_home: Path
) -> None:
    root = make_repo(tmp_path / "repo")
    ids = ["a", "b", "c"]
    with ScriptedModelServer([], scripts=scripts(ids, 1), usage_limit=UsageLimit(1, 7200)) as server:
        configure(root, server)
        code = main(["-C", str(root), "fleet", "--plan", str(plan(root, ids)), "--max-concurrency", "1"])
        first = run_record(root)
        assert code == 3, first["tasks"]
        assert first["run"]["status"] == "usage_limited" and first["run"]["exit_code"] == 3
        tasks = by_id(first["tasks"])
        assert {task["status"] for task in tasks.values()} == {"skipped"}
        later = time.gmtime(time.time() + 7200)
        for task in tasks.values():
            assert task["reason"].startswith("usage limit reached (resets "), task
            assert time.strftime("%Y-%m-%d %H:", later) in task["reason"]
        (usage,) = [row for row in limit_rows(root) if row["kind"] == "usage"]
        assert usage["task_id"] == "a" and usage["reset_at_ms"] > (time.time() + 7000) * 1000
        assert len(server.requests) == 1  # b and c never started: nothing asked the provider
        code = main(["-C", str(root), "fleet", "--plan", str(plan(root, ids)), "--resume", "latest"])
    resumed = run_record(root)
    assert code == 0 and resumed["run"]["resumed_from"] == first["run"]["id"]
    assert {task["status"] for task in resumed["tasks"]} == {"succeeded"}


def test_with_wait_for_limits_a_near_usage_reset_is_waited_for_and_the_run_completes(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_repo(tmp_path / "repo")
    ids = ["a", "b"]
    clock = FakeClock(time.time())  # the fleet waits through it: no real four hundred seconds
    # a reset past FAR_RESET_S (a nearer one is a rate limit, whatever the words)
    with ScriptedModelServer([], scripts=scripts(ids, 1), usage_limit=UsageLimit(1, 400)) as server:
        configure(root, server)
        monkeypatch.chdir(root)
        options = FleetOptions(
            plan_path=str(plan(root, ids)), max_concurrency=1, wait_for_limits=True, quiet=True, cwd=root
        )
        code = run_fleet(options, clock=clock)
    record = run_record(root)
    assert code == 0, record["tasks"]
    assert {task["status"] for task in record["tasks"]} == {"succeeded"}
    a_attempts = [row for row in record["attempts"] if row["task_id"] == "a"]
    assert [row["outcome"] for row in a_attempts] == ["failed", "succeeded"]
    assert a_attempts[1]["reason"] == "limit"
    rows = limit_rows(root)
    (usage,) = [row for row in rows if row["kind"] == "usage"]
    # the wait was a request of the limit gate's, served by the second attempt, held to the reset
    (request,) = record["requests"]
    assert (request["reason"], request["state"], request["asked_by"]) == ("limit", "served", "step")
    assert (request["from_attempt_id"], request["attempt_id"]) == (a_attempts[0]["id"], a_attempts[1]["id"])
    assert request["not_before_ms"] == usage["reset_at_ms"] and request["why"] == "its attempt succeeded"
    # the fleet waited (on its clock, which started before the run) until the reset 400 s after the limit
    assert clock.sleeps and max(clock.sleeps) < 400 + 10, clock.sleeps
    assert clock.now() * 1000 >= usage["reset_at_ms"]
    waits = [row["message"] for row in rows if row["kind"] == "concurrency"]
    assert any(message.startswith("waiting for a usage limit's reset") for message in waits)
