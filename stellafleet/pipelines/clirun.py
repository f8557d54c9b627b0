"""Running an agent CLI (`run_agent`) in its own process group under a timeout and a guard."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stellafleet.core.workercontext import WorkerContext
from stellafleet.engine.redact import Transcript
from stellafleet.pipelines.agentcli import agent_env
from stellafleet.proc import runner

GRACE_S = 5.0  # between SIGTERM and SIGKILL when stopping a CLI
POLL_S = 0.2  # how often a wrapper's poll callback runs while the CLI works
TAIL_LINES = 20  # stderr/stdout lines kept for messages
READER_JOIN_S = 2.0  # how long the output readers get to drain the pipes once the CLI has ended

LineHandler = Callable[[str], str | None]
Poller = Callable[[], str | None]


@dataclass
class CliRun:
    argv: list[str]
    returncode: int | None = None  # negative: killed by that signal; None: never started
    stdout_lines: list[str] = field(default_factory=list)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    stopped: str | None = None  # why the wrapper stopped it, if it did
    timed_out: bool = False
    start_error: str | None = None

    def stderr_text(self, limit: int = 600) -> str:
        text = " | ".join(line.strip() for line in self.stderr_tail if line.strip())
        return text[-limit:]


class _Stop:
    def __init__(self) -> None:
        self.reason: str | None = None
        self.event = threading.Event()
        self._lock = threading.Lock()

    def request(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
        self.event.set()


def _transcript(path: Path | None) -> Transcript | None:
    """The attempt's transcript; None (said on stderr) when it cannot be written."""
    try:
        return Transcript(path)
    except OSError as exc:
        sys.stderr.write(f"stella: cannot write the transcript {path}: {exc.strerror or exc}\n")
        return None


@dataclass
class _Output:
    run: CliRun
    stop: _Stop
    on_line: LineHandler | None
    transcript: Transcript | None  # None once it cannot be written

    def follow(self, text: str) -> None:
        """Hand one stdout line to the wrapper; a reason it returns stops the CLI."""
        if self.on_line is None or self.stop.reason is not None:
            return
        try:
            reason = self.on_line(text)
        except Exception as exc:  # a wrapper bug must not leave the CLI running unwatched
            reason = f"stella could not follow the CLI's output: {type(exc).__name__}: {exc}"
        if reason:
            self.stop.request(reason)

    def record(self, text: str) -> None:
        try:
            if self.transcript is not None:
                self.transcript.append(text)
        except OSError as exc:  # keep draining the pipe even when the disk is full
            sys.stderr.write(f"stella: transcript write failed, no longer recording it: {exc}\n")
            self.transcript = None

    def read_stdout(self, stream: Iterable[str]) -> None:
        for line in stream:
            text = line.rstrip("\n")
            self.run.stdout_lines.append(text)
            self.record(text)
            self.follow(text)

    def read_stderr(self, stream: Iterable[str]) -> None:
        for line in stream:
            text = line.rstrip("\n")
            self.run.stderr_tail.append(text)
            sys.stderr.write(text + "\n")
            sys.stderr.flush()


def _start(run: CliRun, cwd: Path, env: Mapping[str, str], stdin_path: Path | None) -> runner.Process | None:
    """The CLI started in its own process group with its output piped; None (and why) if it cannot start."""
    try:
        with contextlib.ExitStack() as stack:
            stdin = runner.DEVNULL if stdin_path is None else stack.enter_context(stdin_path.open("rb"))
            return runner.start(run.argv, cwd=cwd, env=env, stdin=stdin, text=True)
    except OSError as exc:
        run.start_error = f"cannot start {run.argv[0]}: {exc.strerror or exc}"
        return None


def _watch(
    proc: runner.Process, run: CliRun, stop: _Stop, deadline: float | None, poll: Poller | None
) -> None:
    while proc.poll() is None:
        wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        if stop.event.wait(wait):
            return
        if deadline is not None and time.monotonic() >= deadline:
            run.timed_out = True
            return
        reason = poll() if poll is not None else None
        if reason:
            stop.request(reason)
            return


def _end(proc: runner.Process, run: CliRun, stop: _Stop, readers: list[threading.Thread]) -> None:
    """Stop the CLI's group if the CLI still runs, reap it, and let the readers drain its output."""
    if proc.poll() is None:
        # Only a CLI we actually signal counts as stopped; a reason found after it exited does not.
        run.stopped = None if run.timed_out else stop.reason
        proc.stop(GRACE_S)
    else:
        proc.wait()
    for reader in readers:
        reader.join(timeout=READER_JOIN_S)
    if any(reader.is_alive() for reader in readers):
        # A process the CLI started still holds its output open: kill what is left of the group.
        proc.stop(0.0)
        for reader in readers:
            reader.join(timeout=READER_JOIN_S)


def run_agent(
    ctx: WorkerContext,
    argv: Sequence[str],
    *,
    on_line: LineHandler | None = None,
    poll: Poller | None = None,
    stdin_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> CliRun:
    """Run a task's agent CLI in its workspace until it ends, its timeout, or on_line/poll say stop
    (env: variables of its own, over agent_env's)."""
    run = CliRun(argv=list(argv))
    started = time.monotonic()
    proc = _start(run, ctx.workspace, {**agent_env(ctx), **(env or {})}, stdin_path)
    if proc is None:
        return run
    stop = _Stop()
    output = _Output(run, stop, on_line, _transcript(ctx.transcript_path))
    pipes = ((output.read_stdout, proc.stdout), (output.read_stderr, proc.stderr))
    readers = [threading.Thread(target=read, args=(pipe,), daemon=True) for read, pipe in pipes]
    for reader in readers:
        reader.start()
    deadline = None if ctx.timeout_s is None else started + ctx.timeout_s
    _watch(proc, run, stop, deadline, poll)
    _end(proc, run, stop, readers)
    if poll is not None and not run.timed_out:
        poll()  # a last look at files the CLI wrote just before it exited
    run.returncode = proc.returncode
    return run
