"""The ledger's `requests` (follow-ups asked for, taken exactly once across processes, needs_you) and
`attempt_facts` (what an attempt learned), on real SQLite files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from stellafleet.core.status import AttemptEnd, FollowUpReason, RequestState
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_schema import LEDGER_SCHEMA, MIGRATIONS
from stellafleet.state.sqlitefile import Schema, open_database
from stellafleet.state.views import NEEDS_YOU_KEYS, run_model
from stellafleet.testing.sample_ledger import add_run

RUN = "r-20261207-000000-aaaa"


def _ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger.open(tmp_path / "fleet.db")
    add_run(ledger, RUN, base_commit="c0" * 20)
    ledger.tasks.add(RUN, [PlanTask("t1", "p", "one"), PlanTask("t2", "p", "two")], {"t1": 1, "t2": 1})
    return ledger


TAKE = """
import sys
from stellafleet.state.ledger import Ledger
with Ledger.open(sys.argv[1]) as ledger:
    print(sum(ledger.requests.take(int(i)) for i in sys.argv[2:]))
"""


def test_an_open_request_is_taken_exactly_once_across_processes(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        ids = [
            ledger.requests.ask(RUN, "t1", FollowUpReason.CHECK, f"round {n}", asked_by="step")
            for n in range(40)
        ]
    argv = [sys.executable, "-c", TAKE, str(tmp_path / "fleet.db"), *map(str, ids)]
    takers = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    taken = [int(p.communicate(timeout=120)[0]) for p in takers]
    assert sum(taken) == 40, taken
    with Ledger.open(tmp_path / "fleet.db") as ledger:
        rows = ledger.requests.of_run(RUN)
        assert {row["state"] for row in rows} == {"served"} and all(row["taken_at_ms"] for row in rows)
        assert ledger.requests.take(ids[0]) is False


def test_needs_you_replaces_the_tasks_earlier_one_and_is_dismissed_by_name(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        first = ledger.requests.ask(
            RUN, "t1", FollowUpReason.RETRY, "exit 1", asked_by="fleet", state=RequestState.NEEDS_YOU
        )
        second = ledger.requests.ask(
            RUN, "t1", FollowUpReason.RETRY, "exit 2", asked_by="fleet", state=RequestState.NEEDS_YOU
        )
        red = ledger.requests.ask(
            RUN, "t2", FollowUpReason.CI_FIX, "failure", asked_by="watch", branch="fleet/t2-x",
            state=RequestState.NEEDS_YOU,
        )  # fmt: skip
        assert [row["id"] for row in ledger.requests.needing_you(RUN)] == [second, red]
        assert ledger.requests.get(first)["why"] == "asked again"
        ledger.requests.dismiss(RUN, "t2", "fleet/t2-x", FollowUpReason.CI_FIX, "CI green")
        assert [row["id"] for row in ledger.requests.needing_you(RUN)] == [second]
        assert ledger.requests.get(red)["state"] == "dismissed"
        assert ledger.requests.take(second) is False  # no one takes what waits on a person
        assert [row["id"] for row in ledger.get_run(RUN)["requests"]] == [first, second, red]


def test_the_views_needs_you_is_the_ledgers_and_the_first_view_loads_no_other_request(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        ledger.requests.ask(RUN, "t1", FollowUpReason.CHECK, "round 2", asked_by="step")
        waiting = ledger.requests.ask(
            RUN, "t2", FollowUpReason.RETRY, "exit 1", asked_by="fleet", state=RequestState.NEEDS_YOU
        )
        first_view = ledger.get_run(RUN, first_view=True)
        assert "requests" not in first_view
        for record in (first_view, ledger.get_run(RUN)):
            shown = run_model(record, now_ms=0, alive=lambda pid, started: False)["needs_you"]
            assert [(row["id"], row["context"]) for row in shown] == [(waiting, "exit 1")]
            assert set(shown[0]) == set(NEEDS_YOU_KEYS)


def test_facts_are_set_per_attempt_and_a_task_gets_the_latest_of_each(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        one = ledger.attempts.start(RUN, "t1", pipeline="command")
        ledger.facts.set(one, "session_id", "s-1")
        ledger.facts.set(one, "ports", [8100, 8101])
        ledger.attempts.finish(one, AttemptEnd.failed("red"))
        two = ledger.attempts.start(RUN, "t1", pipeline="command")
        ledger.facts.set(two, "session_id", "s-2")
        ledger.facts.set(two, "session_id", "s-3")  # set again: one row, the newest value
        assert ledger.facts.of_attempt(one) == {"session_id": "s-1", "ports": [8100, 8101]}
        assert ledger.facts.of_attempt(two) == {"session_id": "s-3"}
        assert ledger.facts.of_task(RUN, "t1") == {"session_id": "s-3", "ports": [8100, 8101]}
        assert ledger.facts.of_task(RUN, "t2") == {}


def test_a_version_10_ledger_gets_needs_you_rows_for_its_failed_tasks_and_red_branches(
    tmp_path: Path,
) -> None:
    db = tmp_path / "fleet.db"
    v10 = Schema(LEDGER_SCHEMA.label, LEDGER_SCHEMA.application_id, MIGRATIONS[:10])
    conn = open_database(db, v10)
    conn.execute("INSERT INTO runs (id, created_at_ms) VALUES ('r-old', 1)")
    for task, status in (
        ("ok", "succeeded"),
        ("bad", "failed"),
        ("cut", "interrupted"),
        ("later", "skipped"),
    ):
        conn.execute("INSERT INTO tasks (run_id, id, status) VALUES ('r-old', ?, ?)", (task, status))
    conn.execute(
        "INSERT INTO attempts (run_id, task_id, started_at_ms, finished_at_ms) VALUES ('r-old', 'bad', 2, 3)"
    )
    conn.execute(
        "INSERT INTO ci (run_id, branch, task_id, state, conclusion)"
        " VALUES ('r-old', 'fleet/ok-1', 'ok', 'red', 'failure')"
    )
    conn.commit()
    conn.close()
    with Ledger.open(db) as ledger:
        rows = ledger.requests.needing_you("r-old")
    assert [(r["task_id"], r["reason"], r["branch"], r["asked_by"]) for r in rows] == [
        ("bad", "retry", None, "ledger upgrade"),
        ("cut", "retry", None, "ledger upgrade"),
        ("ok", "ci-fix", "fleet/ok-1", "ledger upgrade"),
    ]
    assert rows[0]["from_attempt_id"] == 1 and rows[0]["asked_at_ms"] == 3
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == LEDGER_SCHEMA.version
