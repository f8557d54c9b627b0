"""The fleet's per-task bookkeeping in few transactions, on real SQLite files: same rows, fewer locks."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN = "r-20261130-120000-fast"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(StatePaths(tmp_path).fleet_db) as opened:
        add_run(opened, RUN)
        opened.tasks.add(RUN, [sample_task("a"), sample_task("b")], {"a": 1, "b": 1})
        yield opened


def task_row(ledger: Ledger, task_id: str) -> dict[str, object]:
    return next(task for task in ledger.get_run(RUN)["tasks"] if task["id"] == task_id)


def test_start_and_finish_attempt_keep_the_task_status_in_step(ledger: Ledger) -> None:
    attempt = ledger.attempts.start(RUN, "a", pipeline="command", log_path="a.log", transcript_path="a.jsonl")
    assert task_row(ledger, "a")["status"] == "running"
    started = ledger.get_run(RUN)["attempts"][0]
    assert (started["id"], started["outcome"], started["log_path"]) == (attempt, "running", "a.log")
    ledger.spend.add(attempt, 0.25, input_tokens=10, output_tokens=2, steps=1)
    spend = ledger.attempts.finish(
        attempt,
        AttemptEnd(
            outcome="failed",
            exit_code=3,
            summary="no parser",
            error="command failed: exit status 3",
            cpu_seconds=0.5,
            peak_rss_bytes=1000,
        ),
    )
    assert spend == 0.25  # what the worker reported along the way
    row = ledger.get_run(RUN)["attempts"][0]
    assert (row["outcome"], row["success"], row["exit_code"], row["summary"]) == ("failed", 0, 3, "no parser")
    assert (row["cpu_seconds"], row["peak_rss_bytes"]) == (0.5, 1000) and row["finished_at_ms"] is not None
    task = task_row(ledger, "a")
    assert (task["status"], task["reason"]) == ("failed", "command failed: exit status 3")
    assert task_row(ledger, "b")["status"] == "pending"  # only the attempt's own task


def test_finish_attempt_refuses_an_unknown_outcome_or_attempt_and_changes_nothing(ledger: Ledger) -> None:
    attempt = ledger.attempts.start(RUN, "a", pipeline="command")
    with pytest.raises(ValueError, match="unknown attempt outcome"):
        ledger.attempts.finish(attempt, AttemptEnd(outcome="done", exit_code=0, summary=""))
    with pytest.raises(StellaError, match="no attempt 999"):
        ledger.attempts.finish(999, AttemptEnd(outcome="succeeded", exit_code=0, summary=""))
    assert ledger.get_run(RUN)["attempts"][0]["outcome"] == "running"
    assert task_row(ledger, "a")["status"] == "running"


def test_releasing_an_attempt_that_holds_nothing_takes_no_write_lock(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    with ClaimStore.open(paths.store_db) as claims:
        holder = Holder.current(RUN, "a", "", 1)
        claims.acquire(["src/a.py", "src/b.py"], holder)
        other = sqlite3.connect(paths.store_db, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process is writing right now
            start = time.monotonic()
            assert claims.release_attempt_if_held(RUN, 2) == 0  # holds nothing: no wait for the lock
            assert time.monotonic() - start < 1.0
            other.execute("COMMIT")
        finally:
            other.close()
        assert claims.release_attempt_if_held(RUN, 1) == 2
        assert claims.claims() == []


def test_an_attempt_that_wrote_no_transcript_keeps_no_transcript_path(ledger: Ledger) -> None:
    kept = ledger.attempts.start(RUN, "a", pipeline="plain", transcript_path="a.jsonl")
    dropped = ledger.attempts.start(RUN, "b", pipeline="command", transcript_path="b.jsonl")
    ledger.attempts.finish(kept, AttemptEnd(outcome="succeeded", exit_code=0, summary="ok"))
    ledger.attempts.finish(
        dropped, AttemptEnd(outcome="succeeded", exit_code=0, summary="ok"), transcript_written=False
    )
    paths = {a["task_id"]: a["transcript_path"] for a in ledger.get_run(RUN)["attempts"]}
    assert paths == {"a": "a.jsonl", "b": None}
