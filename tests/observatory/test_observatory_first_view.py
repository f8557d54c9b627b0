"""The run page's first view (GET /api/runs/<id>/page) and an opened attempt (GET /api/attempts/<id>),
over real HTTP against ledgers written through the Ledger API."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers.observatory import Serve

from stellafleet.core.clock import wall_ms
from stellafleet.core.status import AttemptEnd, AttemptOutcome, CIState, FollowUpReason, RunStatus, TaskStatus
from stellafleet.state.dashboard import FOLD_TASKS_OVER
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import (
    StepClock,
    add_run,
    build_sample_ledger,
    leave_for_you,
    sample_task,
)

RUN_ID = "r-20261130-120000-b1b1"
TASKS = FOLD_TASKS_OVER + 10  # more than the page lists at once: the narrow first view
MARK = "SUMMARY-ONLY-IN-DETAILS"


def _no_constant(name: str) -> Any:
    raise AssertionError(f"not strict JSON: {name}")


def strict(body: bytes) -> Any:
    """json.loads that refuses NaN and Infinity, as a browser's JSON.parse does."""
    return json.loads(body, parse_constant=_no_constant)


def big_run(db: Path, *, live: bool = False) -> dict[str, int]:
    """A run of TASKS tasks in two waves, finished (or, live, started a minute ago by pid 1, which
    outlives it): every seventh task fails once before it succeeds, t5
    fails for good (t6 depends on it and is skipped), each attempt spends in three events (two of them in
    the same millisecond); one attempt commits on a branch whose CI went red. Returns attempt ids by role."""
    clock = StepClock(wall_ms() - 60_000 if live else 1_796_000_000_000, tick_ms=7)
    roles: dict[str, int] = {}
    with Ledger.open(db, now_ms=clock) as ledger:
        add_run(ledger, RUN_ID, spend_limit_usd=50.0, max_concurrency=4, pid=1)
        tasks = [sample_task(f"t{n}", "do it", f"Task {n}") for n in range(TASKS)]
        tasks[6] = sample_task("t6", "after t5", depends_on=("t5",))
        ledger.tasks.add(RUN_ID, tasks, {t.id: 1 if n < TASKS // 2 else 2 for n, t in enumerate(tasks)})
        for n in range(TASKS):
            if n == 6:
                ledger.tasks.set_status(RUN_ID, "t6", TaskStatus.SKIPPED, "dependency failed: t5")
                continue
            for retry in range(2 if n % 7 == 0 else 1):
                attempt = ledger.attempts.start(RUN_ID, f"t{n}", pipeline="plain", branch=f"fleet/t{n}")
                for usd in (0.25, 0.125):
                    ledger.spend.add(attempt, usd, input_tokens=100, steps=1)
                clock.tick_ms = 0
                ledger.spend.add(attempt, 0.0625)  # the same millisecond as the one before
                clock.tick_ms = 7
                failed = n == 5 or (n % 7 == 0 and retry == 0)
                outcome = AttemptOutcome.FAILED if failed else AttemptOutcome.SUCCEEDED
                error = "tests failed: 3 of 40\nmore detail" if failed else None
                ledger.attempts.finish(
                    attempt,
                    AttemptEnd(outcome=outcome, exit_code=1 if failed else 0, summary=MARK, error=error),
                )
                roles.setdefault("failed" if failed else "ok", attempt)
                if n == 5:
                    leave_for_you(ledger, RUN_ID, "t5", error or "", attempt=attempt)
                if n == 3:
                    roles["committed"] = attempt
                    ledger.commits.record(
                        [("c" * 40, "Make t3 pass", clock())],
                        run_id=RUN_ID,
                        task_id="t3",
                        attempt_id=attempt,
                        branch="fleet/t3",
                    )
                    ledger.ci.upsert(
                        run_id=RUN_ID, branch="fleet/t3", task_id="t3", head_sha="c" * 40, pr_url=None,
                        pr_number=None, state=CIState.RED, conclusion="failure", reason=None, run_urls=[],
                    )  # fmt: skip
                    leave_for_you(
                        ledger, RUN_ID, "t3", "failure", branch="fleet/t3", reason=FollowUpReason.CI_FIX
                    )
        if not live:
            ledger.runs.finish(RUN_ID, RunStatus.FAILED, exit_code=1, reason="1 failed")
    return roles


def test_first_view_is_one_strict_bar_per_attempt_and_spend_ending_at_the_total(
    tmp_path: Path, serve: Serve
) -> None:
    db = tmp_path / "fleet.db"
    big_run(db)
    with sqlite3.connect(db) as conn:  # an amount that slipped past the checks must not break the page
        conn.execute("UPDATE attempts SET spend_usd = 9e999 WHERE task_id = 't9'")
        attempts = conn.execute("SELECT id, started_at_ms, finished_at_ms, outcome FROM attempts").fetchall()
        total = conn.execute("SELECT spend_usd FROM runs").fetchone()[0]
    fetch = serve(db)
    status, headers, body = fetch(f"/api/runs/{RUN_ID}/page")
    assert status == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
    page = strict(body)
    bars = page["timeline"]["bars"]
    assert {len(column) for column in bars.values()} == {len(attempts)}
    rows = sorted(zip(bars["attempt"], bars["start_ms"], bars["end_ms"], bars["outcome"], strict=True))
    assert rows == sorted(tuple(a) for a in attempts)  # one bar per attempt, as the ledger has it
    spend = page["spend"]
    assert (
        spend["usd"][-1]
        == spend["total_usd"]
        == pytest.approx(total)
        == pytest.approx(len(attempts) * 0.4375)
    )
    assert len(spend["t_ms"]) == len(spend["usd"]) and spend["usd"] == sorted(spend["usd"])
    assert spend["per_task"][0] == {"task": "t9", "usd": None}  # Infinity is written as null
    assert page["waves"] is None and page["tasks_total"] == TASKS and len(page["graph"]["nodes"]) == TASKS
    assert MARK.encode() not in body  # summaries stay on the server until an attempt is opened
    failed = next(item for item in page["attention"] if item["kind"] == "failed")
    # every line of the error, on one line (a git error's own words often come on the second)
    assert failed["task"] == "t5" and failed["text"] == "tests failed: 3 of 40 more detail"
    assert [i["task"] for i in page["attention"] if i["kind"] == "red_ci"] == ["t3"]
    assert next(n for n in page["graph"]["nodes"] if n["id"] == "t6")["caused_by"] == "t5"
    assert page["commits"][0]["message"] == "Make t3 pass" and not page["run"]["live"]


def test_a_small_run_keeps_its_task_cards_and_a_live_one_grows(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    ids = build_sample_ledger(db, live_pid=os.getpid())
    fetch = serve(db)
    ok = strict(fetch(f"/api/runs/{ids['ok']}/page")[2])
    cards = [task for wave in ok["waves"] for task in wave["tasks"]]
    assert cards[0]["attempts"][0]["summary"].startswith("Added migration 0007")
    assert len(ok["timeline"]["bars"]["attempt"]) == sum(len(task["attempts"]) for task in cards)
    first = strict(fetch(f"/api/runs/{ids['running']}/page")[2])
    assert first["run"]["live"] and None in first["timeline"]["bars"]["end_ms"]  # a running bar
    again = strict(fetch(f"/api/runs/{ids['running']}/page")[2])
    assert again["now_ms"] >= first["now_ms"] and again["timeline"]["end_ms"] >= first["timeline"]["end_ms"]
    status, _, body = fetch("/api/runs/r-1999/page")
    assert status == 404 and "no run matches" in strict(body)["error"]


def test_an_opened_attempt_has_its_details_and_an_unknown_one_is_404(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    roles = big_run(db)
    fetch = serve(db)
    status, _, body = fetch(f"/api/attempts/{roles['committed']}")
    found = strict(body)
    assert (
        status == 200 and found["attempt"]["summary"] == MARK and found["attempt"]["id"] == roles["committed"]
    )
    assert [c["message"] for c in found["commits"]] == ["Make t3 pass"]
    assert found["task"] == {"id": "t3", "title": "Task 3", "branch": None}
    assert found["ci"]["state"] == "red" and found["attempt"]["branch"] == "fleet/t3"
    assert "token_sha256" not in found["attempt"] and found["attempt"]["duration_ms"] >= 0
    failed = strict(fetch(f"/api/attempts/{roles['failed']}")[2])
    assert failed["attempt"]["error"].startswith("tests failed") and failed["commits"] == []
    status, _, body = fetch("/api/attempts/987654")
    assert status == 404 and "no attempt 987654" in strict(body)["error"]
    assert fetch("/api/attempts/12x")[0] == 404


def test_an_attempt_in_setup_shows_the_phase_its_timer_and_its_logs_last_line(
    tmp_path: Path, serve: Serve
) -> None:
    db = tmp_path / "fleet.db"
    log = tmp_path / "a.log"
    log.write_text("[stella] setup: make -j2\ncompiling 3 of 9\n\n")
    clock = StepClock(wall_ms() - 60_000)  # the setup started a minute ago; the page reads the real now
    with Ledger.open(db, now_ms=clock) as ledger:
        add_run(ledger, RUN_ID, pid=1)  # owned by pid 1, running since before the row: the run is live
        ledger.tasks.add(RUN_ID, [sample_task("a")], {"a": 1})
        attempt = ledger.attempts.start(RUN_ID, "a", pipeline="command", log_path=str(log))
        ledger.attempts.set_setup_started(attempt)
    fetch = serve(db)

    def card_attempt() -> dict[str, Any]:
        page = strict(fetch(f"/api/runs/{RUN_ID}/page")[2])
        return dict(page["waves"][0]["tasks"][0]["attempts"][0])

    shown = card_attempt()
    assert shown["phase"] == "setup" and shown["setup_last_line"] == "compiling 3 of 9"
    assert shown["setup_elapsed_ms"] >= 60_000
    with Ledger.open(db, now_ms=clock) as ledger:
        ledger.attempts.set_setup(attempt, 61.5)  # done: its worker runs now
    assert "phase" not in card_attempt()
