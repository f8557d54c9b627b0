"""The fleet's reporters as event sinks: plain lines, quiet lines, one JSON document."""

from __future__ import annotations

import io
import json
from pathlib import Path

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.run.events import (
    AttemptEnded,
    AttemptStarted,
    Notice,
    RunStarted,
    TaskSkipped,
    WaveEnded,
    WaveStarted,
)
from stellafleet.run.reporter import JsonReporter, PlainReporter, make_reporter, outcome_detail, run_headline

DOC = {
    "run_id": "r-20261130-124501-9f3a",
    "status": "spend_limited",
    "exit_code": 3,
    "reason": "spend limit reached: $6.10 of $6.00",
    "spend_usd": 6.1,
    "spend_limit_usd": 6.0,
    "tasks": [
        {
            "id": "schema",
            "wave": 1,
            "status": "succeeded",
            "summary": "added the migration",
            "reason": None,
            "spend_usd": 3.0,
            "branch": None,
        },
        {
            "id": "reader",
            "wave": 2,
            "status": "failed",
            "summary": "tests red",
            "reason": "command failed: exit status 1",
            "spend_usd": 3.1,
            "branch": None,
        },
        {
            "id": "docs",
            "wave": 3,
            "status": "skipped",
            "summary": None,
            "reason": "spend limit reached: $6.10 of $6.00",
            "spend_usd": 0.0,
            "branch": None,
        },
    ],
}


def attempt_started(task: str, *, pid: int, branch: str | None) -> AttemptStarted:
    logs = Path("/repo/.stella/private/logs")
    log, result = logs / f"{task}.log", logs / f"{task}.json"
    return AttemptStarted(task, f"Do {task}", pid, branch, log, result)


def attempt_ended(
    task: str, outcome: AttemptOutcome, summary: str, error: str | None, elapsed_s: float, spend_usd: float
) -> AttemptEnded:
    return AttemptEnded(task, 1, AttemptEnd(outcome, summary, error), elapsed_s, spend_usd)


def feed(reporter: PlainReporter) -> None:
    reporter.handle(
        RunStarted(
            concurrency="max concurrency 2 (--max-concurrency)",
            run_id=str(DOC["run_id"]),
            tasks=("a", "b"),
            waves=(("a",), ("b",)),
            base_ref="main",
            base_commit="0123456789abcdef",
            spend_limit_usd=6.0,
            spend_guard_usd=3.0,
        )
    )
    reporter.handle(WaveStarted(1, ("a",)))
    reporter.handle(attempt_started("a", pid=42, branch="fleet/a-0123456789abcdef"))
    reporter.handle(attempt_ended("a", AttemptOutcome.SUCCEEDED, "did a", None, 1.25, 0.5))
    reporter.handle(
        attempt_ended("b", AttemptOutcome.FAILED, "tests red", "command failed: exit status 1", 75.0, 0.1)
    )
    reporter.handle(TaskSkipped("c", "dependency failed: b"))
    reporter.handle(WaveEnded(1))  # no reporter shows the end of a wave
    reporter.finish(DOC)


def test_plain_lines_tell_the_story_and_end_with_a_table_and_a_headline() -> None:
    out = io.StringIO()
    feed(PlainReporter(out))
    lines = out.getvalue().splitlines()
    assert lines[0] == "stella fleet: max concurrency 2 (--max-concurrency)"
    assert lines[1] == (
        "run r-20261130-124501-9f3a: 2 tasks in 2 waves; base main at 0123456789ab; "
        "spend limit $6.00, $3.00 per worker"
    )
    assert "wave 1: a" in lines
    assert "  started a (isolated on fleet/a-0123456789abcdef, pid 42)" in lines
    assert "  succeeded a after 1.2s ($0.50): did a" in lines
    assert "  failed b after 1m15s ($0.10): command failed: exit status 1: tests red" in lines
    assert "  skipped c: dependency failed: b" in lines
    assert lines[-1] == (
        "run r-20261130-124501-9f3a spend_limited (spend limit reached: $6.10 of $6.00): "
        "1 failed, 1 skipped, 1 succeeded; spend $6.10 of $6.00; exit 3"
    )
    table = [line for line in lines if line.startswith(("task ", "schema ", "reader ", "docs "))]
    assert table[0].split()[:5] == ["task", "wave", "status", "spend", "summary"]
    assert table[2].split("  ")[0] == "reader" and "command failed: exit status 1: tests red" in table[2]


def test_quiet_keeps_only_what_went_wrong_and_the_headline() -> None:
    out = io.StringIO()
    feed(PlainReporter(out, quiet=True))
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["failed", "skipped", "run"]


def test_json_mode_prints_one_document_and_sends_notices_to_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    reporter = JsonReporter(out, err=err)
    reporter.handle(Notice("interrupt: stopping 2 running workers"))
    reporter.handle(WaveStarted(1, ("a",)))
    reporter.finish(DOC)
    assert json.loads(out.getvalue()) == DOC
    assert err.getvalue() == "stella fleet: interrupt: stopping 2 running workers\n"


def test_reporter_choice_and_details() -> None:
    assert isinstance(make_reporter(json_mode=True, quiet=False, stream=io.StringIO()), JsonReporter)
    assert isinstance(make_reporter(json_mode=False, quiet=False, stream=io.StringIO()), PlainReporter)
    assert outcome_detail("succeeded", "done", None) == "done"
    assert outcome_detail(
        "failed", "timed out after 2s", "timed out after 2s (worker killed by signal SIGTERM)"
    ) == ("timed out after 2s (worker killed by signal SIGTERM)")
    assert run_headline({**DOC, "status": "failed", "reason": "1 failed"}).startswith(
        "run r-20261130-124501-9f3a failed: "
    )


def test_counts_read_as_english() -> None:
    from stellafleet.core.words import plural

    assert [plural(n, "wave") for n in (0, 1, 2)] == ["0 waves", "1 wave", "2 waves"]


def test_the_start_line_counts_the_waves_to_run_and_says_emitted_and_resumed_tasks_apart() -> None:
    out = io.StringIO()
    PlainReporter(out).handle(
        RunStarted(
            concurrency="max concurrency 2",
            run_id="r-2",
            tasks=tuple("abcdefghij"),
            waves=(("i", "j"),),
            base_ref="main",
            base_commit="0123456789abcdef",
            spend_limit_usd=None,
            spend_guard_usd=None,
            grows=True,
            done_in="r-1",
        )
    )
    assert out.getvalue().splitlines()[1] == (
        "run r-2: 2 tasks in 1 wave, plus waves for emitted tasks (8 tasks done in run r-1); "
        "base main at 0123456789ab"
    )


def test_an_interrupted_runs_headline_says_interrupted_once() -> None:
    doc = {**DOC, "status": "interrupted", "reason": "interrupted"}
    assert run_headline(doc).startswith(f"run {DOC['run_id']} interrupted: ")
    signalled = run_headline({**doc, "reason": "SIGTERM"})
    assert signalled.startswith(f"run {DOC['run_id']} interrupted (SIGTERM): ")
