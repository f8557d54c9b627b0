"""One task's attempt: claims -> workspace -> executor -> record -> release.

`Dispatcher.execute` is the action the wave runner calls in a thread per task. It always leaves the
ledger consistent (the attempt finished, the task's status set) and always releases the attempt's claims,
whatever happens in between; a task that did not succeed raises TaskFailed with the reason. Where and how
the worker itself runs is the executor's business (executor.py).
"""

from __future__ import annotations

import os
import sysconfig
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stellafleet.core.errors import ClaimConflict, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, worktrees
from stellafleet.pipelines.command import RESULT_ENV
from stellafleet.plan.model import PlanTask
from stellafleet.run.events import AttemptEnded, AttemptStarted, Emit
from stellafleet.run.executor import INTERRUPTED, Attempt, Ending, Execution, Executor
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.worker.main import PIPELINE_ENTRY_ENV

# A worker's own variables never leak from the fleet's environment into a worker: its context's, and
# those the worker process and the command pipeline read besides.
WORKER_VARIABLES = (*WorkerContext.env_names(), PIPELINE_ENTRY_ENV, RESULT_ENV)


class TaskFailed(Exception):
    """A task's attempt did not succeed; the message is the reason shown and recorded."""


@dataclass(frozen=True)
class RunSettings:
    """What every attempt of one run shares."""

    root: Path
    run_id: str
    base_commit: str
    default_pipeline: str
    default_model: str | None = None  # for tasks that name no model (None: the pipeline's own default)
    spend_guard_usd: float | None = None
    config_file: Path | None = None
    pipeline_entries: Mapping[str, str] = field(default_factory=dict)  # name -> "module:attr"

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)


@dataclass
class Record:
    """How an attempt ended, as the ledger stores it."""

    outcome: AttemptOutcome
    summary: str
    error: str | None = None
    exit_code: int | None = None
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None

    @classmethod
    def failed(cls, text: str) -> Record:
        return cls(AttemptOutcome.FAILED, text, text)

    @property
    def reason(self) -> str | None:
        """Why the task did not succeed (None: it did)."""
        return None if self.outcome == AttemptOutcome.SUCCEEDED else (self.error or self.summary)


@dataclass(frozen=True)
class Workspace:
    path: Path
    branch: str | None  # only for isolated tasks

    @property
    def isolated(self) -> bool:
        return self.branch is not None


def claim_keys(root: Path, workspace: Workspace, claims: Sequence[str]) -> list[str]:
    """The claim-store keys of a task's claims: they name files of its own workspace, so an isolated
    task's `x.txt` is its worktree's file and never collides with the shared tree's `x.txt`."""
    if not workspace.isolated:
        return list(claims)
    prefix = workspace.path.relative_to(root).as_posix()
    return [f"{prefix}/{claim}" for claim in claims]


def workspace_for(root: Path, run_id: str, task: PlanTask) -> Workspace:
    """The repository root for shared tasks; `.stella/worktrees/<slug>-<hash>` on `fleet/...` otherwise."""
    if task.isolation != "isolated":
        return Workspace(root, None)
    name = worktrees.isolated_name(run_id, task.id)
    return Workspace(StatePaths(root).worktrees / name, f"fleet/{name}")


def run_env(settings: RunSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every worker of the run inherits: base (default: this process's environment) without any
    worker variables, with the run's config file and this stella's scripts on PATH."""
    env = dict(os.environ if base is None else base)
    for key in WORKER_VARIABLES:
        env.pop(key, None)
    if settings.config_file is not None:
        env["STELLA_CONFIG"] = str(settings.config_file)
    # Workers call `stella commit`: make sure they find this stella, without shadowing anything on PATH.
    scripts = sysconfig.get_path("scripts")
    path = env.get("PATH", "")
    if scripts and scripts not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (path, scripts) if p)
    return env


def task_env(ctx: WorkerContext, settings: RunSettings, inherited: Mapping[str, str]) -> dict[str, str]:
    """One worker's environment: the run's (run_env) and its task's."""
    env = {**inherited, **ctx.to_env()}
    entry = settings.pipeline_entries.get(ctx.pipeline)
    if entry:
        env[PIPELINE_ENTRY_ENV] = entry
    return env


def judge(ending: Ending) -> Record:
    """The record of a worker's end: succeeded only when it exited 0 with a successful result."""
    exit_info, stop_reason, result = ending.exit, ending.stop_reason, ending.result
    measured: dict[str, Any] = {
        "exit_code": exit_info.returncode,
        "cpu_seconds": round(exit_info.cpu_seconds, 3),
        "peak_rss_bytes": exit_info.peak_rss_bytes or None,
    }
    if exit_info.returncode == 0 and result is not None and result.success:
        return Record(AttemptOutcome.SUCCEEDED, result.summary or "done", None, **measured)
    if stop_reason is not None:
        outcome = AttemptOutcome.INTERRUPTED if stop_reason == INTERRUPTED else AttemptOutcome.FAILED
        error = f"{stop_reason} (worker {exit_info.describe()})"
        summary = result.summary if result is not None and result.summary else stop_reason
        return Record(outcome, summary, error, **measured)
    if result is None:
        error = (
            f"worker {exit_info.describe()}"
            if exit_info.returncode != 0
            else "worker exited without leaving a result"
        )
        return Record(AttemptOutcome.FAILED, error, error, **measured)
    error = result.error or f"worker {exit_info.describe()}"
    return Record(AttemptOutcome.FAILED, result.summary or error, error, **measured)


class Dispatcher:
    """Runs attempts for one fleet run; `execute` is thread-safe, one call per task."""

    def __init__(
        self, settings: RunSettings, ledger: Ledger, claims: ClaimStore, executor: Executor, emit: Emit
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.claims = claims
        self.executor = executor
        self.emit = emit
        self._hard_stop = threading.Event()
        self._lock = threading.RLock()  # re-entrant: a signal handler may interrupt a holder
        self._running: dict[str, Execution | None] = {}  # task id -> its worker, once started
        # Worked out once per run rather than per task: the environment every worker inherits, and the
        # directories of the run's results (os.environ is copied and sysconfig asked only here).
        self._env = run_env(settings)
        self._made: set[Path] = set()

    @property
    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def stop_workers(self) -> None:
        """Stop every running worker (and any that starts from now on)."""
        with self._lock:
            self._hard_stop.set()
            started = [execution for execution in self._running.values() if execution is not None]
        for execution in started:
            execution.stop()

    # --- one task ---

    def execute(self, task: PlanTask) -> bool:
        started = time.monotonic()
        ctx = self._open_attempt(task)
        try:
            try:
                record = self._attempt(task, ctx)
            except ClaimConflict as exc:
                record = Record.failed(str(exc))
            except StellaError as exc:
                record = Record.failed(f"could not start the worker: {exc}")
            except Exception as exc:  # a bug must still leave the ledger consistent
                record = Record.failed(f"internal error: {type(exc).__name__}: {exc}")
            spend = self.ledger.finish_attempt(
                ctx.attempt_id,
                outcome=record.outcome,
                exit_code=record.exit_code,
                summary=record.summary,
                error=record.error,
                cpu_seconds=record.cpu_seconds,
                peak_rss_bytes=record.peak_rss_bytes,
                reason=record.reason,
                transcript_written=ctx.transcript_path.exists(),
            )
        finally:
            self.claims.release_attempt_if_held(ctx.run_id, ctx.attempt_id)
            with self._lock:
                self._running.pop(task.id, None)
        self.emit(
            AttemptEnded(
                task=task.id,
                attempt=ctx.attempt_id,
                outcome=record.outcome,
                summary=record.summary,
                error=record.error,
                elapsed_s=time.monotonic() - started,
                spend_usd=spend,
                branch=ctx.branch,
            )
        )
        if record.reason is not None:
            raise TaskFailed(record.reason)
        return True

    def _open_attempt(self, task: PlanTask) -> WorkerContext:
        """The attempt's ledger row (its task now `running`) and what its worker will be told."""
        settings = self.settings
        run_id, paths = settings.run_id, settings.paths
        pipeline = task.pipeline or settings.default_pipeline
        workspace = workspace_for(settings.root, run_id, task)
        log_path = paths.log_file(run_id, task.id)
        transcript_path = paths.transcript_file(run_id, task.id)
        # The task's rows change in two write transactions (three with the worker's pid): the attempt
        # and the task `running` together, then the attempt's end and the task's status together.
        attempt_id = self.ledger.start_attempt(
            run_id,
            task.id,
            pipeline=pipeline,
            branch=workspace.branch,
            worktree=str(workspace.path) if workspace.isolated else None,
            log_path=str(log_path),
            transcript_path=str(transcript_path),
        )
        with self._lock:
            self._running[task.id] = None
        return WorkerContext(
            root=settings.root,
            workspace=workspace.path,
            run_id=run_id,
            task_id=task.id,
            task_title=task.title,
            attempt_id=attempt_id,
            prompt=task.prompt,
            isolation="isolated" if workspace.isolated else "shared",
            branch=workspace.branch,
            base_commit=settings.base_commit,
            spend_guard_usd=settings.spend_guard_usd,
            pipeline=pipeline,
            model=task.model or settings.default_model,
            timeout_s=task.timeout,
            result_path=paths.result_file(run_id, task.id, attempt_id),
            log_path=log_path,
            transcript_path=transcript_path,
        )

    def _make_dir(self, path: Path) -> None:
        if path not in self._made:  # one mkdir per directory per run, not per task
            path.mkdir(parents=True, exist_ok=True)
            self._made.add(path)

    def _attempt(self, task: PlanTask, ctx: WorkerContext) -> Record:
        settings = self.settings
        if self._hard_stop.is_set():
            return Record(AttemptOutcome.INTERRUPTED, "interrupted before the worker started", INTERRUPTED)
        workspace = Workspace(ctx.workspace, ctx.branch)
        if task.claims:
            holder = Holder.current(ctx.run_id, task.id, task.title, ctx.attempt_id)
            self.claims.acquire(claim_keys(settings.root, workspace, task.claims), holder)
        remote = getattr(self.executor, "runs_remotely", None)
        if workspace.branch is not None and remote is not None and remote(ctx):
            # it works in a clone on another machine; its branch comes back from there (no worktree here)
            self.ledger.set_task_workspace(ctx.run_id, task.id, workspace.branch, None)
        elif workspace.branch is not None:
            worktrees.worktree_add(settings.root, workspace.path, workspace.branch, settings.base_commit)
            self.ledger.set_task_workspace(ctx.run_id, task.id, workspace.branch, str(workspace.path))
        self._make_dir(ctx.result_path.parent)
        self._make_dir(ctx.log_path.parent)
        execution = self._start(ctx)
        if execution.pid is not None:
            self.ledger.set_attempt_pid(ctx.attempt_id, execution.pid)
        self.emit(
            AttemptStarted(
                task=task.id,
                title=task.title,
                attempt=ctx.attempt_id,
                pid=execution.pid,
                workspace=ctx.workspace,
                branch=workspace.branch,
                log_path=ctx.log_path,
                result_path=ctx.result_path,
            )
        )
        ending = execution.wait()
        if workspace.branch is not None:
            self._record_branch_commits(ctx, workspace.branch)
        return judge(ending)

    def _start(self, ctx: WorkerContext) -> Execution:
        """Start the worker; one that starts as the run is being stopped is stopped at once."""
        execution = self.executor.start(Attempt(ctx, task_env(ctx, self.settings, self._env)))
        with self._lock:
            self._running[ctx.task_id] = execution
            stopping = self._hard_stop.is_set()
        if stopping:
            execution.stop()
        return execution

    def _record_branch_commits(self, ctx: WorkerContext, branch: str) -> None:
        for commit in gitops.commits_between(ctx.root, ctx.base_commit, branch):
            self.ledger.record_commit(
                sha=commit.sha,
                run_id=ctx.run_id,
                task_id=ctx.task_id,
                attempt_id=ctx.attempt_id,
                branch=branch,
                message=commit.message,
                committed_at_ms=commit.committed_at_ms,
            )
