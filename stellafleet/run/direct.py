"""`[pipelines.command] direct = true`: the fleet runs a command task's shell command itself.

A command task's worker is a Python process whose only work is to run `/bin/sh -c COMMAND`, copy its
output to the log and turn its exit status and report into a result. Here the command is the worker
process: it is started in its own session with its output going straight to the log, and when it ends the
fleet does the rest with the pipeline's own code (pipelines/command.py `conclude`): the report's spend is
recorded in the ledger for the attempt, the result file is written, and the exit status becomes the
worker's (0 or 1). So the ledger rows, the claims and the spend rules are what they are with a worker,
and a killed fleet's commands end with it as its workers would (the run's guard, proc/guard.py, kills
their process groups). What changes is the cost per task, the command's parent process (`$PPID` is the
fleet; the worker process is the shell itself, `$$`) and the log (only the command's output, after one
header line). It is the default: `direct = false` puts a worker process around every command again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path

from stellafleet.core.config import Config
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.command import RESULT_ENV, SHELL, command_for, command_report_path, conclude
from stellafleet.proc.guard import Guard
from stellafleet.proc.tree import ProcessTree
from stellafleet.run.executor import Attempt, Ending, Execution, Executor, LocalExecution
from stellafleet.worker.main import PIPELINE_ENTRY_ENV, LedgerSpend, write_result

BUILTIN_ENTRY = "stellafleet.pipelines.command:CommandPipeline"
TAIL_BYTES = 65536


def last_line(path: Path, offset: int) -> str:
    """The last non-empty line written to path after offset ("" when none)."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(offset, size - TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def covers_every_task(config: Config, pipeline_entries: Mapping[str, str]) -> bool:
    """Whether direct commands run every task of a run whose pipelines are these (name -> entry point):
    then no task needs a worker process, nor the warm launcher that would fork them."""
    return config.pipelines.command.direct and dict(pipeline_entries) == {"command": BUILTIN_ENTRY}


class DirectCommands:
    """An Executor that runs the built-in command pipeline's tasks as their command, and hands every other
    attempt to the executor it wraps."""

    def __init__(self, inner: Executor, config: Config, *, stop_grace_s: float) -> None:
        self.inner = inner
        self.config = config
        self.stop_grace_s = stop_grace_s
        self._guard: Guard | None = None  # started with the first direct command
        self._guard_lock = threading.Lock()

    def _guarded(self) -> Guard | None:
        """The run's guard (proc/guard.py), started on first use; None when there is none to be had."""
        with self._guard_lock:
            if self._guard is None:
                self._guard = Guard.start()
            return self._guard if self._guard is not None and self._guard.alive else None

    def start(self, attempt: Attempt) -> Execution:
        ctx = attempt.context
        command = command_for(self.config, ctx.task_id) if ctx.pipeline == "command" else None
        if command is None or attempt.env.get(PIPELINE_ENTRY_ENV, BUILTIN_ENTRY) != BUILTIN_ENTRY:
            return self.inner.start(attempt)  # a worker runs it (and says what is missing)
        guard = self._guarded()
        if guard is None:  # nothing would end the command with a killed fleet: a worker runs it
            return self.inner.start(attempt)
        report = command_report_path(ctx)
        report.unlink(missing_ok=True)
        ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
        with ctx.log_path.open("a") as log:
            log.write(
                f"stella: run {ctx.run_id} task {ctx.task_id} attempt {ctx.attempt_id} "
                f"command (direct) in {ctx.workspace}\n"
            )
            offset = log.tell()
        tree = ProcessTree.spawn(
            [SHELL, "-c", command],
            cwd=ctx.workspace,
            env={**attempt.env, RESULT_ENV: str(report)},
            log_path=ctx.log_path,
        )
        guard.watch(tree.pid)  # its own session: the group is the shell's pid
        execution = LocalExecution(tree, ctx, stop_grace_s=self.stop_grace_s, sample_interval_s=0.25)
        return DirectExecution(execution, attempt, report, offset, guard)

    def release(self) -> None:
        self.inner.release()

    def close(self) -> None:
        with self._guard_lock:
            guard, self._guard = self._guard, None
        if guard is not None:
            guard.close()
        self.inner.close()


class DirectExecution:
    """A command run as the worker process; its end is concluded as the command pipeline would."""

    def __init__(
        self, inner: LocalExecution, attempt: Attempt, report: Path, offset: int, guard: Guard
    ) -> None:
        self._inner = inner
        self._context = attempt.context
        self._report = report
        self._offset = offset
        self._guard = guard

    @property
    def pid(self) -> int:
        return self._inner.pid

    def stop(self) -> None:
        self._inner.stop()

    def wait(self) -> Ending:
        try:
            ending = self._inner.wait()
        finally:
            self._guard.forget(self._inner.pid)  # reaped, and what it left running killed
        if ending.stop_reason is not None:
            return ending  # stopped: like a stopped worker, it leaves no result
        ctx = self._context
        spend = LedgerSpend(ctx)
        try:
            try:
                result = conclude(
                    ending.exit.returncode, self._report, last_line(ctx.log_path, self._offset), spend
                )
            except Exception as exc:  # as the worker turns a pipeline's exception into a failed result
                text = f"{type(exc).__name__}: {exc}"
                result = PipelineResult(success=False, summary=f"worker error: {text}", error=text)
            spend.settle(result)
        finally:
            spend.close()
        write_result(ctx.result_path, result)
        status = 0 if result.success else 1  # the worker's own exit status
        return Ending(dataclasses.replace(ending.exit, returncode=status), None, result)
