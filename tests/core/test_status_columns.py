"""The status types are the ledger's status columns: the values docs/ledger.md lists, stored and read
back as plain text, and nothing else accepted."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from enum import StrEnum
from pathlib import Path

import pytest

from stellafleet.core.status import AttemptEnd, AttemptOutcome, CIState, MergeStatus, RunStatus, TaskStatus
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

LEDGER_DOC = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def documented(table: str, column: str) -> list[str]:
    """The values docs/ledger.md lists for table.column, in its order."""
    section = LEDGER_DOC.read_text().split(f"### `{table}`", 1)[1].split("\n### ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{column}` |"))
    return re.findall(r"`([a-z_]+)`", row.split("|")[3])


@pytest.mark.parametrize(
    ("kind", "table", "column"),
    [
        (RunStatus, "runs", "status"),
        (TaskStatus, "tasks", "status"),
        (AttemptOutcome, "attempts", "outcome"),
        (CIState, "ci", "state"),
        (MergeStatus, "merges", "status"),
    ],
)
def test_each_status_type_is_what_its_column_accepts_and_documents(
    kind: type[StrEnum], table: str, column: str
) -> None:
    assert [member.value for member in kind] == documented(table, column)


def stored(db: Path, sql: str) -> list[tuple[str, str]]:
    """(value, SQLite type) rows, read past the Ledger: what a user's sqlite3 sees."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


def test_every_status_is_stored_as_plain_text_and_reads_back_equal(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        for status in RunStatus:
            add_run(ledger, f"r-{status}")
            ledger.tasks.add(f"r-{status}", [sample_task("t")], {"t": 1})
            ledger.runs.finish(f"r-{status}", status, exit_code=0)
        for status in TaskStatus:
            ledger.tasks.set_status(f"r-{RunStatus.RUNNING}", "t", status)
            assert ledger.get_run(f"r-{RunStatus.RUNNING}")["tasks"][0]["status"] == status
        for outcome in AttemptOutcome:
            attempt = ledger.attempts.start(f"r-{RunStatus.FAILED}", "t", pipeline="command")
            ledger.attempts.finish(attempt, AttemptEnd(outcome=outcome, exit_code=0, summary=str(outcome)))
        for state in CIState:
            ledger.ci.upsert(
                run_id=f"r-{RunStatus.SUCCEEDED}",
                branch=f"fleet/{state}",
                task_id="t",
                head_sha=None,
                pr_url=None,
                pr_number=None,
                state=state,
                conclusion=None,
                reason=None,
                run_urls=[],
            )
        runs = {run["id"]: run for run in ledger.runs.page()}
        assert [runs[f"r-{status}"]["status"] for status in RunStatus] == list(RunStatus)
        attempts = ledger.get_run(f"r-{RunStatus.FAILED}")["attempts"]
        assert [(a["outcome"], a["success"]) for a in attempts] == [
            (outcome, 1 if outcome == "succeeded" else 0) for outcome in AttemptOutcome
        ]
        ci = ledger.get_run(f"r-{RunStatus.SUCCEEDED}")["ci"]
        assert sorted(entry["state"] for entry in ci) == sorted(CIState)
    assert stored(db, "SELECT DISTINCT status, typeof(status) FROM runs ORDER BY rowid") == [
        (status.value, "text") for status in RunStatus
    ]
    assert stored(db, "SELECT DISTINCT outcome, typeof(outcome) FROM attempts ORDER BY id") == [
        (outcome.value, "text") for outcome in AttemptOutcome
    ]
    assert {row[1] for row in stored(db, "SELECT state, typeof(state) FROM ci")} == {"text"}
    assert json.dumps({TaskStatus.SKIPPED: [CIState.NO_CI]}) == '{"skipped": ["no_ci"]}'


def test_an_unknown_status_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "fleet.db") as ledger:
        add_run(ledger, "r")
        ledger.tasks.add("r", [sample_task("t")], {"t": 1})
        attempt = ledger.attempts.start("r", "t", pipeline="command")
        with pytest.raises(ValueError, match="unknown run status 'done': expected one of running, succeeded"):
            ledger.runs.finish("r", "done", exit_code=0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown task status 'green'"):
            ledger.tasks.set_status("r", "t", "green")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown attempt outcome 'skipped'"):
            ledger.attempts.finish(attempt, AttemptEnd(outcome="skipped", exit_code=0, summary=""))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown CI state 'succeeded'"):
            ledger.ci.upsert(
                run_id="r",
                branch="main",
                task_id=None,
                head_sha=None,
                pr_url=None,
                pr_number=None,
                state="succeeded",  # type: ignore[arg-type]
                conclusion=None,
                reason=None,
                run_urls=[],
            )
        record = ledger.get_run("r")
    assert record["run"]["status"] == RunStatus.RUNNING
    assert record["tasks"][0]["status"] == TaskStatus.RUNNING
    assert record["attempts"][0]["outcome"] == AttemptOutcome.RUNNING
    assert record["ci"] == []


def test_merge_statuses_are_stored_as_plain_text_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        add_run(ledger, "r")
        for status in MergeStatus:
            merge_id = ledger.merges.start(
                run_id="r",
                task_id="t",
                branch=f"fleet/{status}",
                position=1,
                strategy="rebase",
                onto_ref="main",
                before_sha="0" * 40,
                check_command=None,
            )
            ledger.merges.finish(merge_id, status, files=["a.txt"] if status == MergeStatus.CONFLICT else ())
        with pytest.raises(ValueError, match="unknown merge status 'landed'"):
            ledger.merges.finish(merge_id, "landed")  # type: ignore[arg-type]
        rows = ledger.get_run("r")["merges"]
    assert [row["status"] for row in rows] == list(MergeStatus)
    assert rows[2]["files"] == ["a.txt"] and rows[0]["files"] == []
    assert stored(db, "SELECT status, typeof(status) FROM merges ORDER BY id") == [
        (status.value, "text") for status in MergeStatus
    ]
