"""The live reporter's lines, as they scroll above the display, and its colours by status."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.run.events import (
    AttemptEnded,
    AttemptStarted,
    Notice,
    RunStarted,
    TaskEnded,
    TaskSkipped,
    WaveStarted,
)
from stellafleet.run.reporter import LiveReporter

DOC = {
    "run_id": "r-1",
    "status": "failed",
    "exit_code": 1,
    "reason": "1 failed",
    "spend_usd": 0.6,
    "spend_limit_usd": None,
    "tasks": [
        {"id": "a", "wave": 1, "status": "succeeded", "summary": "did a", "reason": None, "spend_usd": 0.5},
        {"id": "b", "wave": 1, "status": "failed", "summary": "red", "reason": "exit 1", "spend_usd": 0.1},
    ],
}


def run_through(reporter: LiveReporter) -> None:
    reporter.handle(
        RunStarted(
            "r-1", "max concurrency 2", "main", "0123456789abcdef", ("a", "b"), (("a", "b"),), None, None
        )
    )
    reporter.handle(WaveStarted(1, ("a", "b")))
    for task in ("a", "b"):
        logs = Path("/repo/.stella/private/logs")
        reporter.handle(AttemptStarted(task, f"Do {task}", 7, None, logs / task, logs / f"{task}.json"))
    reporter.handle(AttemptEnded("a", 1, AttemptEnd(AttemptOutcome.SUCCEEDED, "did a"), 2.0, 0.5))
    reporter.handle(TaskEnded("a", "succeeded", None))  # the wave runner's bookkeeping: not shown
    reporter.handle(AttemptEnded("b", 2, AttemptEnd(AttemptOutcome.FAILED, "red", "exit 1"), 61.0, 0.1))
    reporter.handle(TaskSkipped("c", "dependency failed: b"))
    reporter.handle(Notice("interrupt: stopping 1 running worker"))
    reporter.finish(DOC)


def test_live_lines_scroll_above_the_display_and_end_with_the_table() -> None:
    out = io.StringIO()
    run_through(LiveReporter(stream=out))
    lines = out.getvalue().splitlines()
    assert lines[:7] == [
        "stella fleet: max concurrency 2",
        "run r-1: 2 tasks, base main at 0123456789ab",
        "wave 1: a, b",
        "  succeeded a after 2.0s ($0.50): did a",
        "  failed b after 1m01s ($0.10): exit 1: red",
        "  skipped c: dependency failed: b",
        "stella fleet: interrupt: stopping 1 running worker",
    ]
    assert lines[-1] == "run r-1 failed: 1 failed, 1 succeeded; spend $0.60; exit 1"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_colours_follow_the_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "COLORTERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    run_through(LiveReporter(stream=out))
    text = out.getvalue()
    assert "\x1b[32msucceeded\x1b[0m a after" in text
    assert "\x1b[31mfailed\x1b[0m b after" in text
    assert "\x1b[33mskipped\x1b[0m c:" in text
