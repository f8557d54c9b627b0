"""Where a worker runs: an executor runs it and says how it ended (an AttemptEnd); the ledger, claims and
spend stay with the fleet."""

from __future__ import annotations

import json
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stellafleet.core.paths import read_regular
from stellafleet.core.status import AttemptEnd, AttemptOutcome, Stop, StopReason
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.command import RESULT_ENV
from stellafleet.pipelines.sessions import FACTS_VAR  # what the worker's task learned so far
from stellafleet.proc.tree import POLL_S, Exit, ProcessTree

# -P: the workspace (the cwd) is not put on sys.path, so a repository file can never shadow a module
WORKER_ARGV = (sys.executable, "-P", "-m", "stellafleet.worker.main")
# a worker's own variables never leak from the fleet's environment into a worker
WORKER_VARIABLES = (*WorkerContext.env_names(), RESULT_ENV, FACTS_VAR)
# a sample walks every process of the machine per worker: once a second keeps an idle fleet cheap
SAMPLE_INTERVAL_S = 1.0


def inherited_env(base: Mapping[str, str], *also_cleared: str) -> dict[str, str]:
    """What a worker inherits of base: no worker variables (nor also_cleared), and this stella's scripts
    last on PATH, since workers call `stella commit`."""
    cleared = {*WORKER_VARIABLES, *also_cleared}
    env = {key: value for key, value in base.items() if key not in cleared}
    scripts = sysconfig.get_path("scripts")
    path = env.get("PATH", "")
    if scripts and scripts not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (path, scripts) if p)
    return env


@dataclass(frozen=True)
class Attempt:
    """One attempt, ready to run: what its worker is told and its whole environment."""

    context: WorkerContext
    env: Mapping[str, str]


class Execution(Protocol):
    """A started worker."""

    @property
    def pid(self) -> int | None:
        """The worker's process id, for the ledger and the display (None: no local process)."""
        ...

    def wait(self) -> AttemptEnd:
        """Block until the worker has ended; a worker past its context's timeout is stopped."""
        ...

    def stop(self) -> None:
        """Stop the worker (safe from any thread); wait() then returns an end stopped as INTERRUPTED."""
        ...


class Executor(Protocol):
    def start(self, attempt: Attempt) -> Execution: ...

    def runs_remotely(self, context: WorkerContext) -> bool:
        """Whether this attempt's worker runs on another machine (then no worktree is made for it here)."""
        ...

    def release(self) -> None:
        """No attempt starts any more: let what serves them wind down while the run finishes."""
        ...

    def close(self) -> None: ...


def read_result(path: Path) -> PipelineResult | None:
    """The worker's result file (None: none, or not a regular file: a FIFO there must not hang the fleet)."""
    try:
        return PipelineResult.from_json(json.loads(read_regular(path)))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def attempt_end(exit_info: Exit, stop: Stop | None, result: PipelineResult | None) -> AttemptEnd:
    """How a worker ended: succeeded only when it exited 0 with a successful result."""
    measured: dict[str, Any] = {
        "stop": stop,
        "exit_code": exit_info.returncode,
        "cpu_seconds": round(exit_info.cpu_seconds, 3),
        "peak_rss_bytes": exit_info.peak_rss_bytes or None,
        "claimed_usd": result.spend_usd if result is not None else 0.0,
        "facts": result.facts if result is not None else {},
    }
    if exit_info.returncode == 0 and result is not None and result.success:
        return AttemptEnd(AttemptOutcome.SUCCEEDED, result.summary or "done", None, **measured)
    if stop is not None:
        interrupted = stop.reason is StopReason.INTERRUPTED
        outcome = AttemptOutcome.INTERRUPTED if interrupted else AttemptOutcome.FAILED
        error = f"{stop} (worker {exit_info.describe()})"
        summary = result.summary if result is not None and result.summary else str(stop)
        return AttemptEnd(outcome, summary, error, **measured)
    if result is None:
        error = (
            f"worker {exit_info.describe()}"
            if exit_info.returncode != 0
            else "worker exited without leaving a result"
        )
        return AttemptEnd(AttemptOutcome.FAILED, error, error, **measured)
    error = result.error or f"worker {exit_info.describe()}"
    return AttemptEnd(AttemptOutcome.FAILED, result.summary or error, error, **measured)


class LocalExecutor:
    """Every worker a fresh `python -m stellafleet.worker.main` process tree on this machine."""

    def __init__(self, *, stop_grace_s: float = 5.0) -> None:
        self.stop_grace_s = stop_grace_s

    def start(self, attempt: Attempt) -> LocalExecution:
        ctx = attempt.context
        tree = ProcessTree.spawn(WORKER_ARGV, cwd=ctx.workspace, env=attempt.env, log_path=ctx.log_path)
        return LocalExecution(tree, ctx, stop_grace_s=self.stop_grace_s)

    def runs_remotely(self, context: WorkerContext) -> bool:
        return False

    def release(self) -> None:
        """Nothing serves the workers but the workers themselves."""

    def close(self) -> None:
        """Each worker's tree is gone once its wait() returned: nothing is left to close."""


class LocalExecution:
    """One worker's process tree, waited on by one dispatch thread and stoppable from any other."""

    def __init__(self, tree: ProcessTree, context: WorkerContext, *, stop_grace_s: float) -> None:
        self._tree = tree
        self._context = context
        self._grace = stop_grace_s
        self._stopped = threading.Event()  # set by stop(); it also wakes the waiting thread

    @property
    def pid(self) -> int:
        return self._tree.pid

    def stop(self) -> None:
        self._stopped.set()

    def wait(self) -> AttemptEnd:
        exit_info, stop_reason = self._follow()
        return attempt_end(exit_info, stop_reason, read_result(self._context.result_path))

    def _follow(self) -> tuple[Exit, Stop | None]:
        """Wait for the worker, sampling its tree; on timeout or stop(), stop the tree. However it ended,
        whatever it left running is killed with it."""
        tree, timeout = self._tree, self._context.timeout_s
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        next_sample = start + min(0.1, SAMPLE_INTERVAL_S)
        stop_reason: Stop | None = None
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                stop_reason = Stop(StopReason.TIMED_OUT, f"timed out after {timeout:g}s")
            elif self._stopped.is_set():
                stop_reason = Stop(StopReason.INTERRUPTED)
            if stop_reason is not None:
                tree.stop(self._grace)
                break
            if now >= next_sample:
                tree.sample()
                next_sample = now + SAMPLE_INTERVAL_S
            done = tree.poll()
            if done is not None:
                tree.signal_tree(signal.SIGKILL)
                return done, None
            until = next_sample if deadline is None else min(next_sample, deadline)
            self._stopped.wait(min(POLL_S, max(until - now, 0.0)))
        while (done := tree.wait(1.0)) is None:
            tree.signal_tree(signal.SIGKILL)
        tree.signal_tree(signal.SIGKILL)
        return done, stop_reason
