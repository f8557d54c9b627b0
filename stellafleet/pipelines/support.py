"""What every agent-CLI wrapper shares: settings, preflight, running the CLI under a timeout and a guard.

There is one way to run an agent CLI here (`run_cli`): it starts the CLI in its own process group with
stdin closed, hands each stdout line to the wrapper as it arrives (the wrappers parse JSON events
live), copies stderr to the worker's log, keeps stdout in the attempt's transcript, and stops the whole
group (SIGTERM, then SIGKILL after a grace period) when the task timeout passes or when the wrapper says
so (its spend guard is reached). Stopping the group matters: agent CLIs start shells, test runners and
language servers that must not outlive the attempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO

from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.spend import money
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.proc.tree import signal_description

GRACE_S = 5.0  # between SIGTERM and SIGKILL when stopping a CLI
POLL_S = 0.2  # how often a wrapper's poll callback runs while the CLI works
TAIL_LINES = 20  # stderr/stdout lines kept for messages
VERSION_TIMEOUT_S = 20.0

# A callback that looks at the CLI's progress and returns why to stop it, or None to let it go on.
LineHandler = Callable[[str], str | None]
Poller = Callable[[], str | None]


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CliSettings:
    """`[pipelines.<name>]` for a CLI wrapper."""

    binary: str
    extra_args: tuple[str, ...] = ()
    model: str | None = None
    max_turns: int | None = None


def cli_settings(config: Config, pipeline: str, default_binary: str) -> CliSettings:
    """Read and check `[pipelines.<pipeline>]`: binary, extra_args (list or shell words), model, max_turns."""
    where = f"[pipelines.{pipeline}] in the config"
    table = config.section(f"pipelines.{pipeline}")
    binary = table.get("binary", default_binary)
    if not isinstance(binary, str) or not binary.strip():
        raise StellaError(f"{where}: binary must be a command name or path", exit_code=EXIT_USAGE)
    extra = table.get("extra_args", [])
    if isinstance(extra, str):
        extra = shlex.split(extra)
    if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
        raise StellaError(f"{where}: extra_args must be a list of strings", exit_code=EXIT_USAGE)
    model = table.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise StellaError(f"{where}: model must be a model name", exit_code=EXIT_USAGE)
    max_turns = table.get("max_turns")
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise StellaError(f"{where}: max_turns must be a whole number >= 1", exit_code=EXIT_USAGE)
    return CliSettings(binary=binary.strip(), extra_args=tuple(extra), model=model, max_turns=max_turns)


def find_cli(binary: str) -> str | None:
    """The full path of binary (a name looked up on PATH, or a path), or None when it is not there."""
    return shutil.which(binary)


def cli_version(binary: str) -> str | None:
    """The first line `binary --version` prints, or None when it cannot be run."""
    path = find_cli(binary)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


class AgentCliPipeline:
    """Base of the wrappers: config, preflight and version for one agent CLI. Subclasses add `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_binary: ClassVar[str]
    display_name: ClassVar[str]
    install_hint: ClassVar[str]

    def settings(self, config: Config) -> CliSettings:
        return cli_settings(config, self.name, self.default_binary)

    def cli_path(self, config: Config) -> str | None:
        return find_cli(self.settings(config).binary)

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """The CLI is configured and installed; subclasses that price tokens also check the model's price."""
        try:
            binary = self.settings(config).binary
        except StellaError as exc:
            return str(exc)
        if find_cli(binary) is None:
            return (
                f"pipeline {self.name}: {self.display_name} CLI {binary!r} not found on PATH: "
                f"install it with `{self.install_hint}` "
                f'(or set [pipelines.{self.name}] binary = "/path/to/{self.default_binary}")'
            )
        return None

    def version(self, config: Config | None = None) -> str | None:
        binary = self.default_binary
        if config is not None:
            try:
                binary = self.settings(config).binary
            except StellaError:
                return None
        return cli_version(binary)


def model_for(ctx: WorkerContext, settings: CliSettings) -> str | None:
    """The task's own model wins over the wrapper's configured one; None lets the CLI choose."""
    return ctx.model or settings.model


# --- the environment and the prompt an agent gets --------------------------------------------


def scratch_dir(ctx: WorkerContext) -> Path:
    """A private directory for this attempt's wrapper files (settings, logs), outside the work tree."""
    path = ctx.paths.private / "pipelines" / ctx.run_id / f"{ctx.task_id}-{ctx.attempt_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def agent_env(ctx: WorkerContext, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment: ours, the worker context (so `stella commit` works inside the agent),
    and this installation's `stella` first on PATH."""
    env = dict(os.environ if base is None else base)
    env.update(ctx.to_env())
    bin_dir = str(Path(sys.executable).parent)
    if (Path(bin_dir) / "stella").exists():
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
        env["PATH"] = os.pathsep.join([bin_dir, *parts])
    return env


def commit_instructions(ctx: WorkerContext) -> str:
    """How a wrapped agent must commit, appended to its prompt."""
    if ctx.shared:
        return (
            "You are one of several agents working in the same git working tree at the same time.\n"
            "- Change only the files this task needs. If an edit is refused because another task holds the "
            "file, do not retry it: work around it or say so in your final answer.\n"
            "- Do not run `git add`, `git commit`, `git stash`, `git reset`, `git checkout` or "
            "`git restore`: they would sweep in or discard other agents' work.\n"
            '- To commit, run `stella commit -m "<message>" <path> [<path> ...]`, naming exactly the files '
            "you changed. It commits only those paths and records the commit for this task.\n"
            "- End with a short summary of what you did."
        )
    branch = f" on branch {ctx.branch}" if ctx.branch else ""
    return (
        f"You are working in your own git worktree{branch}; no one else writes here.\n"
        '- Commit your finished work before you stop (`git add <paths>` then `git commit -m "<message>"`, '
        'or `stella commit -m "<message>" <path> ...`). Every commit on this branch is recorded for '
        "this task; uncommitted changes are not part of the result.\n"
        "- End with a short summary of what you did."
    )


def agent_prompt(ctx: WorkerContext) -> str:
    return f"{ctx.prompt.rstrip()}\n\n---\n{commit_instructions(ctx)}\n"


# --- running a CLI ---------------------------------------------------------------------------


@dataclass
class CliRun:
    """What happened to one CLI invocation."""

    argv: list[str]
    returncode: int | None = None  # negative: killed by that signal; None: never started
    stdout_lines: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the wrapper stopped it, if it did
    timed_out: bool = False
    start_error: str | None = None
    duration_s: float = 0.0

    def exit_text(self) -> str:
        return "no exit status" if self.returncode is None else signal_description(self.returncode)

    def stderr_text(self, limit: int = 600) -> str:
        text = " | ".join(line.strip() for line in self.stderr_tail if line.strip())
        return text[-limit:]

    def stdout_tail(self, lines: int = TAIL_LINES) -> list[str]:
        return self.stdout_lines[-lines:]


class _Stop:
    """The first reason to stop wins; setting it wakes the waiting thread."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.event = threading.Event()
        self._lock = threading.Lock()

    def request(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
        self.event.set()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stop_group(proc: subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM to the CLI's whole process group, SIGKILL to whatever is left after grace_s."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # Members of the group may outlive the leader; the group id stays theirs while any member lives.
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _open_transcript(path: Path | None, log: TextIO) -> TextIO | None:
    """The transcript to append the CLI's stdout to; a transcript that cannot be written is not fatal."""
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        log.write(f"stella: cannot write the transcript {path}: {exc.strerror or exc}\n")
        return None


def run_cli(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float | None,
    on_line: LineHandler | None = None,
    poll: Poller | None = None,
    transcript: Path | None = None,
    log: TextIO | None = None,
    grace_s: float = GRACE_S,
    poll_s: float = POLL_S,
) -> CliRun:
    """Run an agent CLI to its end, or until timeout_s passes, or until on_line/poll return a reason."""
    run = CliRun(argv=list(argv))
    log = log if log is not None else sys.stderr
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            run.argv,
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        run.start_error = f"cannot start {run.argv[0]}: {exc.strerror or exc}"
        return run
    stop = _Stop()
    stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
    log_lock = threading.Lock()

    def read_stdout() -> None:
        assert proc.stdout is not None
        sink = _open_transcript(transcript, log)
        try:
            for line in proc.stdout:
                text = line.rstrip("\n")
                run.stdout_lines.append(text)
                if sink is not None:
                    try:
                        sink.write(text + "\n")
                        sink.flush()
                    except OSError as exc:  # keep draining the pipe even when the disk is full
                        log.write(f"stella: transcript write failed, no longer recording it: {exc}\n")
                        sink.close()
                        sink = None
                if on_line is not None and stop.reason is None:
                    try:
                        reason = on_line(text)
                    except Exception as exc:  # a wrapper bug must not leave the CLI running unwatched
                        reason = f"stella could not follow the CLI's output: {type(exc).__name__}: {exc}"
                    if reason:
                        stop.request(reason)
        finally:
            if sink is not None:
                sink.close()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            text = line.rstrip("\n")
            stderr_tail.append(text)
            with log_lock:
                log.write(text + "\n")
                log.flush()

    readers = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=read_stderr, daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = None if timeout_s is None else started + timeout_s
    while proc.poll() is None:
        wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
        if stop.event.wait(wait):
            break
        if deadline is not None and time.monotonic() >= deadline:
            run.timed_out = True
            break
        if poll is not None:
            reason = poll()
            if reason:
                stop.request(reason)
                break
    if proc.poll() is None:
        # Only a CLI we actually signal counts as stopped; a reason found after it exited does not.
        run.stopped = None if run.timed_out else stop.reason
        _stop_group(proc, grace_s)
    else:
        proc.wait()
    for reader in readers:
        reader.join(timeout=2.0)
    if any(reader.is_alive() for reader in readers):
        # A process the CLI started still holds its output open: stop what is left of the group.
        _signal_group(proc.pid, signal.SIGKILL)
        for reader in readers:
            reader.join(timeout=2.0)
    if poll is not None and not run.timed_out:
        poll()  # a last look at files the CLI wrote just before it exited
    run.returncode = proc.returncode
    run.stderr_tail = list(stderr_tail)
    run.duration_s = time.monotonic() - started
    return run


def run_agent(
    ctx: WorkerContext,
    argv: Sequence[str],
    *,
    on_line: LineHandler | None = None,
    poll: Poller | None = None,
) -> CliRun:
    """run_cli for a task's agent: in its workspace, with the agent environment, the task's timeout and
    the attempt's transcript."""
    return run_cli(
        argv,
        cwd=ctx.workspace,
        env=agent_env(ctx),
        timeout_s=ctx.timeout_s,
        on_line=on_line,
        poll=poll,
        transcript=ctx.transcript_path,
    )


# --- turning what happened into a result ------------------------------------------------------


def failed(summary: str, *, error: str | None = None, **totals: Any) -> PipelineResult:
    return PipelineResult(success=False, summary=summary, error=error or summary, **totals)


def timeout_text(cli: str, timeout_s: float | None, spent_usd: float | None = None) -> str:
    spent = "" if spent_usd is None else f" ({money(spent_usd, precise=True)} spent)"
    return f"{cli} did not finish within the task timeout of {timeout_s:g}s and was stopped{spent}"


def crash_text(cli: str, run: CliRun) -> str:
    if run.start_error:
        return run.start_error
    detail = run.stderr_text()
    return f"{cli} ended ({run.exit_text()}) before reporting a result" + (f": {detail}" if detail else "")


def parse_failure(cli: str, detail: str, run: CliRun, *, log: TextIO | None = None) -> str:
    """The message for output we could not understand; the raw tail goes to the worker's log."""
    log = log if log is not None else sys.stderr
    log.write(f"stella: could not parse {cli} output ({detail}); the last lines it printed were:\n")
    for line in run.stdout_tail():
        log.write(f"  | {line}\n")
    log.flush()
    return f"could not parse {cli} output: {detail}"


def short(text: str, limit: int = 300) -> str:
    """One line of at most limit characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def json_line(line: str) -> dict[str, Any] | None:
    """The JSON object on one output line, or None when the line is not one."""
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
