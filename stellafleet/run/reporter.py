"""What a fleet run shows while it works: an event sink, like doit's reporter.

The control, the wave runner and the dispatcher only emit events (events.py); a reporter decides how they
look: a live rich display on a terminal, plain lines for CI logs, or one JSON document at the end. Events
come from many dispatch threads, so every reporter serialises them. The run's result document
(run/result.py) goes to `finish`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Protocol, cast

from stellafleet.core import jsontext
from stellafleet.core.spend import money
from stellafleet.core.status import AttemptOutcome, RunStatus, TaskStatus
from stellafleet.core.terminal import printable
from stellafleet.run.events import (
    AttemptEnded,
    AttemptStarted,
    Event,
    EventSink,
    Notice,
    RunStarted,
    TaskSkipped,
    WaveStarted,
)

# task id -> (steps, spend in dollars) of running attempts, for the live display
ProgressProbe = Callable[[], Mapping[str, tuple[int, float]]]


# The colour of a task's status (or an attempt's outcome) on a terminal.
STATUS_COLORS: dict[str, str] = {
    TaskStatus.SUCCEEDED: "green",
    TaskStatus.FAILED: "red",
    TaskStatus.INTERRUPTED: "yellow",
    TaskStatus.SKIPPED: "yellow",
}
# Tasks whose attempt ended: what their worker said is worth showing.
ATTEMPTED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.INTERRUPTED)


class Reporter(Protocol):
    """Where a run's events go (from many threads), and its result document at the end."""

    def handle(self, event: Event) -> None: ...

    def finish(self, doc: Mapping[str, Any]) -> None: ...

    def abort(self) -> None:
        """Give back what the display holds when the run ends without a result (after finish: nothing)."""
        ...


def escape(text: str) -> str:
    """Text for rich markup: `[bold]` in a model's summary is shown, not applied."""
    from rich.markup import escape as markup_escape

    return markup_escape(text)


def counted(n: int, noun: str) -> str:
    """`1 task`, `2 tasks`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def elapsed_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def one_line(text: str | None, limit: int = 100) -> str:
    """text on one line, its control characters shown escaped (core/terminal.py), cut at limit."""
    flat = " ".join(printable(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def outcome_detail(outcome: AttemptOutcome | TaskStatus, summary: str | None, error: str | None) -> str:
    """The summary of a success; for anything else the error, followed by the worker's own words."""
    if outcome == AttemptOutcome.SUCCEEDED or not error:
        return summary or ""
    if summary and summary != error and summary not in error:
        return f"{error}: {summary}"
    return error


def run_headline(doc: Mapping[str, Any]) -> str:
    counts: dict[str, int] = {}
    for task in doc.get("tasks", []):
        counts[task["status"]] = counts.get(task["status"], 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no tasks"
    limit = doc.get("spend_limit_usd")
    spend = money(doc.get("spend_usd")) + (f" of {money(limit)}" if limit else "")
    shown = (
        doc.get("reason") if doc.get("status") != RunStatus.FAILED else None
    )  # the counts say why it failed
    reason = f" ({shown})" if shown else ""
    return printable(
        f"run {doc['run_id']} {doc['status']}{reason}: {parts}; spend {spend}; exit {doc['exit_code']}"
    )


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """task, wave, status, spend, summary-or-reason, branch: one row per task."""
    rows = []
    for task in doc.get("tasks", []):
        if task["status"] in ATTEMPTED:
            # a task an earlier run did (--resume) has no attempt here: its reason says where it was done
            detail = outcome_detail(task["status"], task.get("summary"), task.get("reason"))
            detail = detail or task.get("reason") or ""
        else:
            detail = task.get("reason") or ""
        rows.append(
            (
                task["id"],
                str(task.get("wave") or "-"),
                task["status"],
                money(task.get("spend_usd") or 0.0),
                one_line(detail, 80),
                task.get("branch") or "",
            )
        )
    return rows


class PlainReporter(EventSink):
    """One line per happening: readable in CI logs and pipes."""

    def __init__(self, stream: IO[str] | None = None, *, quiet: bool = False) -> None:
        super().__init__()
        self.stream = stream or sys.stdout
        self.quiet = quiet

    def _say(self, text: str, *, always: bool = False) -> None:
        if always or not self.quiet:
            print(printable(text), file=self.stream, flush=True)

    def on_run_started(self, event: RunStarted) -> None:
        self._say(f"stella fleet: {event.concurrency}")
        limit = event.spend_limit_usd
        spend = f"; spend limit {money(limit)}, {money(event.spend_guard_usd)} per worker" if limit else ""
        self._say(
            f"run {event.run_id}: {counted(len(event.tasks), 'task')} in "
            f"{counted(len(event.waves), 'wave')}; "
            f"base {event.base_ref} at {event.base_commit[:12]}{spend}"
        )

    def on_wave_started(self, event: WaveStarted) -> None:
        self._say(f"wave {event.wave}: {', '.join(event.tasks)}")

    def on_attempt_started(self, event: AttemptStarted) -> None:
        where = f"isolated on {event.branch}" if event.branch else "shared tree"
        process = "remote" if event.pid is None else f"pid {event.pid}"
        self._say(f"  started {event.task} ({where}, {process})")

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        end = event.end
        detail = outcome_detail(end.outcome, end.summary, end.error)
        self._say(
            f"  {end.outcome} {event.task} after {elapsed_text(event.elapsed_s)} "
            f"({money(event.spend_usd)}): {one_line(detail, 160)}",
            always=end.outcome != AttemptOutcome.SUCCEEDED,
        )

    def on_task_skipped(self, event: TaskSkipped) -> None:
        self._say(f"  skipped {event.task}: {event.reason}", always=True)

    def on_notice(self, event: Notice) -> None:
        self._say(f"stella fleet: {event.text}", always=True)

    def finish(self, doc: Mapping[str, Any]) -> None:
        with self._lock:
            if not self.quiet:
                rows = [("task", "wave", "status", "spend", "summary / reason", "branch"), *summary_rows(doc)]
                widths = [max(len(row[i]) for row in rows) for i in range(5)]
                print("", file=self.stream)
                for row in rows:
                    cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:5])]
                    print(("  ".join(cells) + "  " + row[5]).rstrip(), file=self.stream)
                print("", file=self.stream)
            print(run_headline(doc), file=self.stream, flush=True)


class JsonReporter(EventSink):
    """Silent while running (notices go to stderr); one JSON document at the end."""

    def __init__(self, stream: IO[str] | None = None, *, err: IO[str] | None = None) -> None:
        super().__init__()
        self.stream = stream or sys.stdout
        self.err = err or sys.stderr

    def on_notice(self, event: Notice) -> None:
        print(f"stella fleet: {event.text}", file=self.err, flush=True)

    def finish(self, doc: Mapping[str, Any]) -> None:
        with self._lock:
            jsontext.dump(doc, self.stream, indent=2, sort_keys=False, default=str)
            self.stream.write("\n")
            self.stream.flush()


class LiveReporter(EventSink):
    """A rich live view: the wave and one line per running worker; finished tasks scroll above it."""

    def __init__(self, *, probe: ProgressProbe | None = None, stream: IO[str] | None = None) -> None:
        super().__init__()
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream or sys.stdout)
        self.probe = probe
        self._running: dict[str, tuple[float, str]] = {}  # task -> (start, title)
        self._wave = 0
        self._waves = 0
        self._progress: Mapping[str, tuple[int, float]] = {}
        self._probed_at = 0.0
        self._live = Live(
            console=self.console, get_renderable=self._render, refresh_per_second=4, transient=True
        )
        self._started = False

    def _render(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        if self.probe is not None and now - self._probed_at >= 1.0:
            self._probed_at = now
            # a busy or half-written ledger never breaks the display
            with contextlib.suppress(Exception):
                self._progress = self.probe()
        grid = Table.grid(padding=(0, 2))
        # No reporter lock here: this runs under Live's own lock, and handlers print through Live.
        running = dict(self._running)
        spent = sum(spend for _, spend in self._progress.values())
        grid.add_row(
            f"[bold]wave {self._wave}/{self._waves or '?'}[/]" if self._waves else "[bold]eager[/]",
            f"{len(running)} running",
            "",
            money(spent),
            "",
        )
        for task, (started, title) in running.items():
            steps, spend = self._progress.get(task, (0, 0.0))
            grid.add_row(
                f"  {task}", elapsed_text(now - started), f"{steps} steps", money(spend), escape(title)
            )
        return grid

    def on_run_started(self, event: RunStarted) -> None:
        self.console.print(f"stella fleet: {event.concurrency}", highlight=False)
        self.console.print(
            f"run {event.run_id}: {len(event.tasks)} tasks, base {event.base_ref} "
            f"at {event.base_commit[:12]}",
            highlight=False,
        )
        self._waves = len(event.waves) if event.schedule == "waves" else 0
        self._live.start()
        self._started = True

    def on_wave_started(self, event: WaveStarted) -> None:
        self._wave = event.wave
        self.console.print(f"[bold]wave {self._wave}[/]: {', '.join(event.tasks)}", highlight=False)

    def on_attempt_started(self, event: AttemptStarted) -> None:
        self._running[event.task] = (time.monotonic(), one_line(event.title, 50))

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        self._running.pop(event.task, None)
        end = event.end
        color = STATUS_COLORS.get(end.outcome, "yellow")
        detail = outcome_detail(end.outcome, end.summary, end.error)
        self.console.print(
            f"  [{color}]{end.outcome}[/] {event.task} after {elapsed_text(event.elapsed_s)} "
            f"({money(event.spend_usd)}): {escape(one_line(detail, 120))}",
            highlight=False,
            markup=True,
        )

    def on_task_skipped(self, event: TaskSkipped) -> None:
        self.console.print(
            f"  [yellow]skipped[/] {event.task}: {escape(printable(event.reason))}", highlight=False
        )

    def on_notice(self, event: Notice) -> None:
        self.console.print(f"[bold yellow]stella fleet:[/] {escape(printable(event.text))}", highlight=False)

    def abort(self) -> None:
        """Give the terminal back (cursor, scrolling) when a run ends without a result."""
        with self._lock:
            if self._started:
                self._started = False
                self._live.stop()

    def finish(self, doc: Mapping[str, Any]) -> None:
        from rich.table import Table

        with self._lock:
            self.abort()
            table = Table(title=None, show_lines=False)
            for column in ("task", "wave", "status", "spend", "summary / reason", "branch"):
                table.add_column(column, overflow="fold")
            for row in summary_rows(doc):
                status = f"[{STATUS_COLORS.get(row[2], 'white')}]{row[2]}[/]"
                table.add_row(row[0], row[1], status, row[3], escape(row[4]), row[5])
            self.console.print(table)
            self.console.print(run_headline(doc), highlight=False, markup=False)


class LossyStream:
    """A reporter's output that drops what it cannot write once its reader is gone.

    A closed pipe (`stella fleet ... | head -1`) or a hung-up terminal makes every write fail (EPIPE, EIO).
    The reporter is only a sink: that must not abort the run half-way with its tasks, attempts and claims
    left as they were, so the first failure silences the stream and the run goes on to record its end.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                self._stream.write(text)
            except OSError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except OSError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        # What is still buffered would fail again when the interpreter flushes its streams at exit.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... as the real stream's
        return getattr(self._stream, name)


def make_reporter(
    *, json_mode: bool, quiet: bool, probe: ProgressProbe | None = None, stream: IO[str] | None = None
) -> Reporter:
    out = cast(IO[str], LossyStream(stream or sys.stdout))
    if json_mode:
        return JsonReporter(out, err=cast(IO[str], LossyStream(sys.stderr)))
    if not quiet and out.isatty():
        return LiveReporter(probe=probe, stream=out)
    return PlainReporter(out, quiet=quiet)


def print_dry_run(doc: Mapping[str, Any], *, json_mode: bool, stream: IO[str] | None = None) -> None:
    """The waves and workspaces a run would use, without running anything."""
    out = stream or sys.stdout
    if json_mode:
        jsontext.dump(doc, out, indent=2)
        out.write("\n")
        return
    print(f"stella fleet --dry-run: {doc['concurrency']}", file=out)
    print(
        f"base {doc['base_ref']} at {str(doc['base_commit'])[:12]}; nothing runs, nothing is recorded",
        file=out,
    )
    if doc.get("resumes"):
        done = ", ".join(doc.get("done") or []) or "none"
        print(f"resumes {doc['resumes']}; done there, no new attempt: {done}", file=out)
    tasks = {task["id"]: task for task in doc["tasks"]}
    for number, wave in enumerate(doc["waves"], start=1):
        print(f"wave {number}:", file=out)
        for task_id in wave:
            task = tasks[task_id]
            if task["isolation"] == "isolated":
                where = f"isolated: {task['worktree']} on {task['branch']}"
            else:
                where = "shared tree"
            deps = f"; after {', '.join(task['depends_on'])}" if task["depends_on"] else ""
            claims = f"; claims {', '.join(task['claims'])}" if task["claims"] else ""
            print(f"  {task_id} [{task['pipeline']}] {where}{deps}{claims}", file=out)
    if any(task["isolation"] == "isolated" for task in doc["tasks"]):
        print(
            f"(branch hashes come from the run id: this preview used {doc['run_id']}; "
            "a real run gets its own)",
            file=out,
        )
    for problem in doc.get("problems", []):
        print(f"problem: {problem}", file=out)
