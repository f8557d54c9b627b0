"""The live reporter's lines, as they scroll above the display, and its colours by status."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

import pytest

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.run.events import (
    AttemptEnded,
    AttemptStarted,
    LockWaiting,
    Notice,
    RunStarted,
    SetupStarted,
    TaskEnded,
    TaskSkipped,
    WaveStarted,
)
from stellafleet.run.reporter import LiveReporter
from tests.helpers.screen import final_screen

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


def started(task: str) -> AttemptStarted:
    logs = Path("/repo/.stella/private/logs")
    return AttemptStarted(task, f"Do {task}", 7, None, logs / task, logs / f"{task}.json")


def test_the_view_shows_the_run_total_against_the_limit_across_waves() -> None:
    """The dollar figure is the whole run's (what ended in wave 1 stays counted in wave 2), of the limit."""
    progress: dict[str, tuple[int, float]] = {}
    total = [0.0]
    reporter = LiveReporter(stream=io.StringIO(), probe=lambda: (dict(progress), total[0]))
    reporter.handle(
        RunStarted("r-1", "max concurrency 1", "main", "0" * 40, ("a", "b"), (("a",), ("b",)), 5.0, 5.0)
    )
    try:
        assert rows_of(reporter)[0][:2] == ["starting", "0 running"]  # not `eager` before wave 1
        reporter.handle(WaveStarted(1, ("a",)))
        reporter.handle(started("a"))
        progress["a"], total[0] = (1, 0.03), 0.03
        assert rows_of(reporter) == [["wave 1/2", "1 running", "", "$0.03 of $5.00", ""], ["a", "1 step"]]
        del progress["a"]
        reporter.handle(AttemptEnded("a", 1, AttemptEnd(AttemptOutcome.SUCCEEDED, "did a"), 2.0, 0.03))
        reporter.handle(WaveStarted(2, ("b",)))
        reporter.handle(started("b"))
        progress["b"], total[0] = (2, 0.01), 0.04
        assert rows_of(reporter)[0][3] == "$0.04 of $5.00"
        assert rows_of(reporter)[1][:2] == ["b", "2 steps"]
        total[0] = 0.0  # a ledger read that lags behind the events never takes the figure back down
        assert rows_of(reporter)[0][3] == "$0.04 of $5.00"
    finally:
        reporter.abort()


def rows_of(reporter: LiveReporter) -> list[list[str]]:
    """The view's header row, then each task's name and steps (its elapsed time and title left out)."""
    from rich.text import Text

    reporter._probed_at = 0.0  # probe again now
    columns = reporter._render().columns
    cells = [[cell.plain if isinstance(cell, Text) else str(cell) for cell in col.cells] for col in columns]
    rows = [[cell.strip() for cell in row] for row in zip(*cells, strict=True)]
    return [rows[0]] + [[row[0], row[2]] for row in rows[1:]]


def test_every_line_survives_the_views_refreshes_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts end on many threads while Live redraws its view from its own: each finished task's line
    stays on the screen, and the view (`wave 1/1 ... running`) is gone once the run is over. A print that
    interleaved with a refresh used to move the cursor by a stale height: a line vanished, a view line
    stayed behind."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERM", "xterm")
    tasks = tuple(f"t{n:02d}" for n in range(32))
    out = Terminal()
    reporter = LiveReporter(stream=out, probe=lambda: ({}, 0.0), refresh_per_second=2000)
    reporter.handle(RunStarted("r-1", "max concurrency 4", "main", "0" * 40, tasks, (tasks,), 5.0, 0.6))
    reporter.handle(WaveStarted(1, tasks))

    def work(mine: tuple[str, ...]) -> None:
        for task in mine:
            reporter.handle(started(task))
            end = AttemptEnd(AttemptOutcome.SUCCEEDED, f"did {task}")
            reporter.handle(AttemptEnded(task, 1, end, 1.0, 0.01))

    threads = [threading.Thread(target=work, args=(tasks[n::4],)) for n in range(4)]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch all the time: the race, if there is one, is met at once
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
    doc = {
        **DOC,
        "status": "succeeded",
        "exit_code": 0,
        "reason": None,
        "spend_usd": 0.24,
        "spend_limit_usd": 5.0,
        "tasks": [],
    }
    reporter.finish(doc)
    screen = final_screen(out.getvalue())
    for task in tasks:
        assert f"  succeeded {task} after 1.0s ($0.01): did {task}" in screen, "\n".join(screen)
    assert not [line for line in screen if "running" in line], "\n".join(screen)
    assert screen[-1] == "run r-1 succeeded: no tasks; spend $0.24 of $5.00; exit 0"


def test_at_80_columns_the_summary_table_keeps_each_task_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run's cells (a long branch, a long summary) wrapped 3 to 5 lines each at 80 columns: the
    narrow table leaves out the wave and branch columns and cuts the summary with an ellipsis."""
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    reporter = LiveReporter(stream=out)
    summary = "Migrated the lint-staged configuration loader to the new resolver and updated every test of it"
    task = {"wave": 1, "status": "succeeded", "summary": summary, "reason": None, "spend_usd": 0.25}
    tasks = [
        {**task, "id": f"migrate-loader-{n}", "branch": f"fleet/migrate-loader-{n}-0123456789abcdef"}
        for n in range(3)
    ]
    reporter.finish({**DOC, "tasks": tasks})
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    rows = [line for line in lines if "migrate-loader-" in line]
    assert len(rows) == 3, out.getvalue()  # one line per task
    assert all(len(line) <= 80 for line in lines), out.getvalue()
    assert "…" in rows[0] and "succeeded" in rows[0] and "$0.25" in rows[0]
    assert "branch" not in out.getvalue() and "fleet/" not in out.getvalue()


def test_a_setup_shows_as_a_phase_with_its_timer_and_the_last_line_of_its_log(tmp_path: Path) -> None:
    """A 176 s setup read `0 running $0.00`: now it is a row of its own until its worker starts."""
    log = tmp_path / "a.log"
    log.write_text("[stella] setup: make -j2\ncc -c src/server.c\n\n")
    reporter = LiveReporter(stream=io.StringIO())
    reporter.handle(RunStarted("r-1", "max concurrency 1", "main", "0" * 40, ("a",), (("a",),), None, None))
    try:
        reporter.handle(WaveStarted(1, ("a",)))
        reporter.handle(SetupStarted("a", log))
        assert rows_of(reporter) == [["wave 1/1", "0 running, 1 in setup", "", "$0.00", ""], ["a", "setup"]]
        assert "cc -c src/server.c" in _cells(reporter)[-1]
        reporter.handle(started("a"))
        assert rows_of(reporter) == [["wave 1/1", "1 running", "", "$0.00", ""], ["a", "0 steps"]]
    finally:
        reporter.abort()


def _cells(reporter: LiveReporter) -> list[str]:
    """The view's last row, every cell of it."""
    from rich.text import Text

    last = [list(col.cells)[-1] for col in reporter._render().columns]
    return [cell.plain if isinstance(cell, Text) else str(cell) for cell in last]


def test_a_task_waiting_for_a_lock_says_for_which_and_whom_until_it_starts() -> None:
    reporter = LiveReporter(stream=io.StringIO(), probe=lambda: ({}, 0.0))
    reporter.handle(
        RunStarted("r-1", "max concurrency 2", "main", "0" * 40, ("a", "b"), (("a", "b"),), None, None)
    )
    try:
        reporter.handle(WaveStarted(1, ("a", "b")))
        reporter.handle(started("a"))
        reporter.handle(LockWaiting("b", "port:5199", "a"))
        assert rows_of(reporter)[0][1] == "1 running, 1 waiting for locks"
        said = [getattr(cell, "plain", cell) for cell in reporter._render().columns[4].cells]
        assert "waiting for lock port:5199 (held by a)" in said
        reporter.handle(started("b"))
        assert [row[0] for row in rows_of(reporter)[1:]] == ["a", "b"]  # its wait is over
    finally:
        reporter.abort()
