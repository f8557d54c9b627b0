"""What a fleet run shows while it works: a live display, plain lines, or one JSON document at the end."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from stellafleet.core import jsontext
from stellafleet.core.clock import wall_ms
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import money
from stellafleet.core.status import AttemptOutcome, RunStatus, TaskStatus, outcome_detail
from stellafleet.core.terminal import Piece, aligned, last_line, one_line, styled
from stellafleet.core.words import duration_text, plural, tasks_in_waves
from stellafleet.run.events import (
    AttemptEnded,
    AttemptStarted,
    EventSink,
    LockWaiting,
    Notice,
    RunStarted,
    SetupStarted,
    TasksEmitted,
    TaskSkipped,
    WaveStarted,
)
from stellafleet.run.steps.factory import MIXED_PIPELINES
from stellafleet.state.ledger import Ledger
from stellafleet.state.views import run_model

if TYPE_CHECKING:
    from rich.text import Text

# (task id -> (steps, dollars) of its running attempt, the run's total spend) for the live display
ProgressProbe = Callable[[], tuple[Mapping[str, tuple[int, float]], float]]


STATUS_COLORS: dict[str, str] = {
    TaskStatus.SUCCEEDED: "green",
    TaskStatus.FAILED: "red",
    TaskStatus.INTERRUPTED: "yellow",
    TaskStatus.SKIPPED: "yellow",
}
# Tasks whose attempt ended: what their worker said is worth showing.
ATTEMPTED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.INTERRUPTED)


def status_counts(statuses: Iterable[str]) -> str:
    """`1 failed, 5 succeeded`: how many tasks ended in each status (empty for none)."""
    return ", ".join(f"{n} {status}" for status, n in sorted(Counter(statuses).items()))


def run_headline(doc: Mapping[str, Any]) -> str:
    """`run R failed: 1 failed, 5 succeeded; spend $0.00; exit 1`."""
    parts = status_counts(task["status"] for task in doc.get("tasks", [])) or "no tasks"
    limit = doc.get("spend_limit_usd")
    spend = money(doc.get("spend_usd")) + (f" of {money(limit)}" if limit else "")
    # a failed run's counts say why it failed
    said = doc.get("reason") not in (None, "", doc.get("status"))  # not `interrupted (interrupted)`
    reason = f" ({doc['reason']})" if said and doc.get("status") != RunStatus.FAILED else ""
    return f"run {doc['run_id']} {doc['status']}{reason}: {parts}; spend {spend}; exit {doc['exit_code']}"


SUMMARY_HEADERS = ("task", "wave", "status", "spend", "summary / reason", "branch")
WIDE_TABLE = 120  # columns from which the summary table shows all of SUMMARY_HEADERS


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    rows = []
    for task in doc.get("tasks", []):
        status = task["status"]
        # a task an earlier run did (--resume) has no attempt here: its reason says where it was done
        detail = (
            outcome_detail(status, task.get("summary"), task.get("reason")) if status in ATTEMPTED else ""
        )
        detail = one_line(detail or task.get("reason"), 80, cut="…")
        if task.get("no_commits"):
            detail = one_line(f"NO COMMITS: {detail}", 80, cut="…")
        wave, spend = str(task.get("wave") or "-"), money(task.get("spend_usd") or 0.0)
        rows.append((task["id"], wave, status, spend, detail, task.get("branch") or ""))
    return rows


class PlainReporter(EventSink):
    """One line per happening: readable in CI logs and pipes (LiveReporter styles the same lines)."""

    def __init__(self, stream: IO[str] | None = None, *, quiet: bool = False) -> None:
        super().__init__()
        self.stream = stream or sys.stdout
        self.quiet = quiet

    def _say(self, *pieces: Piece, always: bool = False) -> None:
        if always or not self.quiet:
            self._write(styled(*pieces))

    def _write(self, line: Text) -> None:
        print(line.plain, file=self.stream, flush=True)

    def on_run_started(self, event: RunStarted) -> None:
        self._say(f"stella fleet: {event.concurrency}")
        limit = event.spend_limit_usd
        spend = f"; spend limit {money(limit)}, {money(event.spend_guard_usd)} per worker" if limit else ""
        to_run = sum(len(wave) for wave in event.waves)
        done = len(event.tasks) - to_run
        counted = tasks_in_waves(to_run, len(event.waves), grows=event.grows)
        if event.done_in and done > 0:
            counted += f" ({plural(done, 'task')} done in run {event.done_in})"
        self._say(f"run {event.run_id}: {counted}; base {event.base_ref} at {event.base_commit[:12]}{spend}")

    def on_wave_started(self, event: WaveStarted) -> None:
        self._say((f"wave {event.wave}", "bold"), f": {', '.join(event.tasks)}")

    def on_attempt_started(self, event: AttemptStarted) -> None:
        where = f"isolated on {event.branch}" if event.branch else "shared tree"
        process = "remote" if event.pid is None else f"pid {event.pid}"
        self._say(f"  started {event.task} ({where}, {process})")

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        end = event.end
        detail = outcome_detail(end.outcome, end.summary, end.error)
        self._say(
            "  ",
            (end.outcome, STATUS_COLORS.get(end.outcome, "yellow")),
            f" {event.task} after {duration_text(event.elapsed_s)} ({money(event.spend_usd)}): ",
            one_line(detail, 160, cut="…"),
            always=end.outcome != AttemptOutcome.SUCCEEDED,
        )

    def on_lock_waiting(self, event: LockWaiting) -> None:
        self._say(f"  {event.task} {event.describe()}")

    def on_task_skipped(self, event: TaskSkipped) -> None:
        self._say("  ", ("skipped", "yellow"), f" {event.task}: {event.reason}", always=True)

    def on_notice(self, event: Notice) -> None:
        self._say(("stella fleet:", "bold yellow"), f" {event.text}", always=True)

    def on_tasks_emitted(self, event: TasksEmitted) -> None:
        shown = ", ".join(event.tasks[:8]) + (", ..." if len(event.tasks) > 8 else "")
        self._say(f"  {event.parent} emitted {plural(len(event.tasks), 'task')}: {shown}")

    def _table(self, rows: list[tuple[str, ...]]) -> None:
        for line in ["", *aligned(rows), ""]:
            self._write(styled(line))

    def finish(self, doc: Mapping[str, Any]) -> None:
        with self._lock:
            self.abort()
            if not self.quiet:
                self._table([SUMMARY_HEADERS, *summary_rows(doc)])
            self._say(run_headline(doc), always=True)


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
            print(jsontext.dumps(doc, indent=2, default=str), file=self.stream, flush=True)


class LiveReporter(PlainReporter):
    """A rich live view of the wave and each running worker, the plain lines styled above it."""

    def __init__(
        self,
        *,
        probe: ProgressProbe | None = None,
        stream: IO[str] | None = None,
        refresh_per_second: float = 4,
    ) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=self.stream)
        self.probe = probe
        self._running: dict[str, tuple[float, str]] = {}  # task -> (start, title)
        self._wave = 0
        self._waves = 0
        self._schedule = "starting"
        self._setups: dict[str, tuple[float, Path]] = {}  # task -> when its setup started, its log
        self._waits: dict[str, tuple[float, str]] = {}  # task -> since when it waits for a lock, for which
        self._grown = False
        self._progress: Mapping[str, tuple[int, float]] = {}
        self._spent = 0.0  # the whole run's, all waves so far, as the ledger last said
        self._ended_spend = 0.0  # what the attempts that ended spent, as their events said
        self._limit: float | None = None
        self._probed_at = 0.0
        self._live = Live(
            console=self.console,
            get_renderable=self._render,
            refresh_per_second=refresh_per_second,
            transient=True,
        )

    def _write(self, line: Text) -> None:
        # Under Live's lock, so a refresh from Live's thread cannot interleave with the print.
        with self._live._lock:
            self.console.print(line)

    def _render(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        if self.probe is not None and now - self._probed_at >= 1.0:
            self._probed_at = now
            # a busy or half-written ledger never breaks the display
            with contextlib.suppress(Exception):
                self._progress, self._spent = self.probe()
        grid = Table.grid(padding=(0, 2))
        # No reporter lock here: this runs under Live's own lock, and handlers print under it too.
        running = dict(self._running)
        setups, waits = dict(self._setups), dict(self._waits)
        # the run's total, not only what the running tasks spent: it must not go back down between waves
        running_spend = sum(spend for task, (_, spend) in self._progress.items() if task in running)
        spent = max(self._spent, self._ended_spend + running_spend)
        total = money(spent) + (f" of {money(self._limit)}" if self._limit else "")
        waves = "?" if self._grown else self._waves  # emitted tasks run in waves the plan did not have
        where = f"wave {self._wave}/{waves or '?'}" if self._wave else self._schedule  # before wave 1 too
        busy = f"{len(running)} running" + (f", {len(setups)} in setup" if setups else "")
        busy += f", {len(waits)} waiting for locks" if waits else ""
        grid.add_row(styled((where, "bold")), busy, "", total, "")
        for task, (started, log_path) in setups.items():  # the setup's timer and the last line of its log
            grid.add_row(f"  {task}", duration_text(now - started), "setup", "", styled(last_line(log_path)))
        for task, (since, what) in waits.items():
            grid.add_row(f"  {task}", duration_text(now - since), "waiting", "", styled(what))
        for task, (started, title) in running.items():
            steps, spend = self._progress.get(task, (0, 0.0))
            grid.add_row(
                f"  {task}", duration_text(now - started), plural(steps, "step"), money(spend), styled(title)
            )
        return grid

    def on_run_started(self, event: RunStarted) -> None:
        self._say(f"stella fleet: {event.concurrency}")
        self._say(
            f"run {event.run_id}: {len(event.tasks)} tasks, base {event.base_ref} at {event.base_commit[:12]}"
        )
        self._waves = len(event.waves) if event.schedule == "waves" else 0
        self._schedule = "eager" if event.schedule == "eager" else "starting"
        self._limit = event.spend_limit_usd
        self._live.start()

    def on_setup_started(self, event: SetupStarted) -> None:
        with self._live._lock:
            self._setups[event.task] = (time.monotonic(), event.log_path)
            self._waits.pop(event.task, None)

    def on_lock_waiting(self, event: LockWaiting) -> None:
        with self._live._lock:
            self._waits[event.task] = (time.monotonic(), event.describe())

    def on_wave_started(self, event: WaveStarted) -> None:
        self._wave = event.wave
        super().on_wave_started(event)

    def on_tasks_emitted(self, event: TasksEmitted) -> None:
        self._grown = True
        super().on_tasks_emitted(event)

    def on_attempt_started(self, event: AttemptStarted) -> None:
        with self._live._lock:  # the view is drawn from Live's thread: change what it shows under its lock
            self._running[event.task] = (time.monotonic(), one_line(event.title, 50, cut="…"))
            self._setups.pop(event.task, None)
            self._waits.pop(event.task, None)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        with self._live._lock:
            self._running.pop(event.task, None)
            self._setups.pop(event.task, None)  # a setup that failed: no worker started
            self._waits.pop(event.task, None)
            self._ended_spend += event.spend_usd
        super().on_attempt_ended(event)

    def abort(self) -> None:
        """Give the terminal back (cursor, scrolling) when a run ends without a result."""
        with self._lock:
            if self._live.is_started:
                self._live.stop()

    def _table(self, rows: list[tuple[str, ...]]) -> None:
        from rich.table import Table

        header, *rows = rows
        # under 120 columns every cell wrapped: then one line a task, without the wave and the branch,
        # its summary cut to what the other columns leave
        narrow = self.console.width < WIDE_TABLE
        shown = [i for i, name in enumerate(header) if not (narrow and name in ("wave", "branch"))]
        text = header.index("summary / reason")
        widths = {i: min(30, max(len(row[i]) for row in [header, *rows])) for i in shown if i != text}
        room = max(10, self.console.width - sum(widths.values()) - 3 * len(shown) - 1)
        table = Table()
        for i in shown:
            table.add_column(header[i], overflow="fold" if i == text else "ellipsis", min_width=widths.get(i))
        for row in rows:
            color = STATUS_COLORS.get(row[2], "white")
            cells = [styled(cell) for cell in row]
            cells[2] = styled((row[2], color))
            if narrow:
                cells[text] = styled(one_line(row[text], room, cut="…"))
            table.add_row(*(cells[i] for i in shown))
        self.console.print(table)


class LossyStream:
    """A reporter's output that drops what it cannot write once its reader is gone (EPIPE, EIO)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        self._unless_lost(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._unless_lost(self._stream.flush)

    def _unless_lost(self, call: Callable[..., object], *args: str) -> None:
        if self.lost:
            return
        try:
            call(*args)
        except OSError:
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
) -> EventSink:
    out = cast(IO[str], LossyStream(stream or sys.stdout))
    if json_mode:
        return JsonReporter(out, err=cast(IO[str], LossyStream(sys.stderr)))
    if not quiet and out.isatty():
        return LiveReporter(probe=probe, stream=out)
    return PlainReporter(out, quiet=quiet)


def print_dry_run(doc: Mapping[str, Any], *, json_mode: bool, stream: IO[str]) -> None:
    """The waves and workspaces a run would use, without running anything."""
    if json_mode:
        print(jsontext.dumps(doc, indent=2), file=stream)
        return
    lines = [
        f"stella fleet --dry-run: {doc['concurrency']}",
        f"base {doc['base_ref']} at {str(doc['base_commit'])[:12]}; nothing runs, nothing is recorded",
    ]
    if doc.get("resumes"):
        done = ", ".join(doc.get("done") or []) or "none"
        lines.append(f"resumes {doc['resumes']}; done there, no new attempt: {done}")
        if doc.get("emitted"):
            lines.append(f"kept from what its tasks emitted: {', '.join(doc['emitted'])}")
    tasks = {task["id"]: task for task in doc["tasks"]}
    for number, wave in enumerate(doc["waves"], start=1):
        lines.append(f"wave {number}:")
        for task_id in wave:
            task = tasks[task_id]
            isolated = task["isolation"] == "isolated"
            where = (
                f"isolated: {task['worktree']} on {task['branch']} from {task['starts_at']}"
                if isolated
                else "shared tree"
            )
            deps = f"; after {', '.join(task['depends_on'])}" if task["depends_on"] else ""
            claims = f"; claims {', '.join(task['claims'])}" if task["claims"] else ""
            claims += f"; locks {', '.join(task['locks'])}" if task.get("locks") else ""
            claims += f"; {plural(task['ports'], 'port')}" if task.get("ports") else ""
            grows = (
                "; expands at run time (what it emits runs before its dependents)" if task["expands"] else ""
            )
            lines.append(f"  {task_id} [{task['pipeline']}] {where}{deps}{claims}{grows}")
    if doc.get("worktree"):
        wt = doc["worktree"]
        setup = f"setup `{wt['setup']}` (timeout {wt['setup_timeout']:g} s)" if wt["setup"] else "no setup"
        copies = f"{plural(wt['include_files'], 'file')} ({wt['include_bytes'] / 1e6:.1f} MB)"
        lines.append(f"each new worktree: .worktreeinclude copies {copies}; {setup}")
    if any(task["isolation"] == "isolated" for task in doc["tasks"]):
        lines.append(
            f"(branch hashes come from the run id: this preview used {doc['run_id']}; "
            "a real run gets its own)"
        )
    lines += [f"--watch: will push {push} (what shared tasks commit)" for push in doc.get("watch_pushes", [])]
    lines += [f"problem: {problem}" for problem in doc.get("problems", [])]
    stream.write("".join(line + "\n" for line in lines))


# the run's result document (`stella fleet --json`, every reporter's `finish`), from its read model
ATTEMPT_KEYS = (
    "id",  # the ledger's id (`number` is the task's own count, as people read it)
    "number",
    "outcome",
    "success",
    "exit_code",
    "started_at_ms",
    "finished_at_ms",
    "pid",
    "spend_usd",
    "input_tokens",
    "output_tokens",
    "steps",
    "summary",
    "error",
    "cpu_seconds",
    "peak_rss_bytes",
    "branch",
    "worktree",
    "log_path",
    "checks",  # each run of the task's check on this attempt (state/views.py: check_view)
    "facts",  # what it learned or held: its session id, its locks, its leased ports
)
RUN_KEYS = ("status", "exit_code", "reason", "base_ref", "base_commit", "max_concurrency")
RUN_KEYS_AFTER_SPEND = ("spend_limit_usd", "created_at_ms", "finished_at_ms", "schedule", "resumed_from")


def _task_result(task: Mapping[str, Any], run_pipeline: str | None) -> dict[str, Any]:
    attempts = [{key: attempt[key] for key in ATTEMPT_KEYS} for attempt in task["attempts"]]
    ran = task["attempts"][-1].get("pipeline") if task["attempts"] else None
    default = run_pipeline if run_pipeline != MIXED_PIPELINES else None
    return {
        **{key: task[key] for key in ("id", "title", "wave", "status", "reason", "isolation")},
        "pipeline": task["pipeline"] or ran or default,
        **{key: task[key] for key in ("depends_on", "expands", "parent", "claims", "branch", "worktree")},
        "spend_usd": round(task["spend_usd"], 6),
        "summary": attempts[-1]["summary"] if attempts else None,
        "commits": [commit["sha"] for commit in task["commits"]],
        "no_commits": task["no_commits"],  # succeeded, and it made no commit at all
        "attempts": attempts,
    }


def result_document(record: dict[str, Any], watch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine-readable result of a run, from the ledger's record of it (Ledger.get_run)."""
    model = run_model(record, now_ms=wall_ms())
    run = model["run"]
    return {
        # the header `stella runs RUN --json` has; a run just finished is resumed by none yet
        "run": {**run, "resumed_by": []},
        # the earlier shape's top-level fields, kept for compatibility: the same values as run.*
        "run_id": run["id"],
        **{key: run[key] for key in RUN_KEYS},
        "spend_usd": round(run["spend_usd"], 6),
        **{key: run[key] for key in RUN_KEYS_AFTER_SPEND},
        "tasks": [_task_result(task, run["pipeline"]) for task in model["tasks"]],
        "branches": [
            {key: entry[key] for key in ("branch", "tasks", "commits")} for entry in model["branches"]
        ],
        "watch": dict(watch) if watch is not None else None,
    }


def run_reporter(root: Path, run_id: str, *, json_mode: bool, quiet: bool, out: IO[str]) -> EventSink:
    """The run's display: live (with what its workers spent so far), plain lines, or --json."""

    def probe() -> tuple[Mapping[str, tuple[int, float]], float]:
        with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
            return ledger.attempts.running_progress(run_id), ledger.spend.of_run(run_id)

    return make_reporter(json_mode=json_mode, quiet=quiet, probe=probe, stream=out)
