"""One task's attempt: claims -> workspace -> worker process -> wait -> record -> release.

`Dispatcher.execute` is the action the wave runner calls in a thread per task. It always leaves the
ledger consistent (the attempt finished, the task's status set) and always releases the attempt's claims,
whatever happens in between; a task that did not succeed raises TaskFailed with the reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stellafleet.core.errors import ClaimConflict, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, worktrees
from stellafleet.pipelines.base import PipelineResult
from stellafleet.plan.model import PlanTask
from stellafleet.proc.tree import Exit, ProcessTree
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.worker.launcher import Launcher, LauncherGone

# -P: the workspace (the cwd) is not put on sys.path, so a repository file can never shadow a module
WORKER_ARGV = (sys.executable, "-P", "-m", "stellafleet.worker.main")
# WorkerContext variables (and the worker's own) never leak from the fleet's environment into a worker.
_WORKER_KEYS = [
    "ROOT",
    "WORKSPACE",
    "RUN_ID",
    "TASK_ID",
    "TASK_TITLE",
    "ATTEMPT_ID",
    "PROMPT",
    "ISOLATION",
    "BRANCH",
    "BASE_COMMIT",
    "SPEND_GUARD",
    "PIPELINE",
    "MODEL",
    "TIMEOUT",
    "RESULT_FILE",
    "LOG_FILE",
    "TRANSCRIPT_FILE",
    "COMMAND_RESULT",
    "PIPELINE_ENTRY",
]

Emit = Callable[[str, Mapping[str, Any]], None]


class TaskFailed(Exception):
    """A task's attempt did not succeed; the message is the reason shown and recorded."""


@dataclass(frozen=True)
class RunSettings:
    """What every attempt of one run shares."""

    root: Path
    run_id: str
    base_commit: str
    default_pipeline: str
    spend_guard_usd: float | None = None
    config_file: Path | None = None
    pipeline_entries: Mapping[str, str] = field(default_factory=dict)  # name -> "module:attr"
    stop_grace_s: float = 5.0
    sample_interval_s: float = 0.25

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)


@dataclass
class Record:
    """How an attempt ended, as the ledger stores it."""

    outcome: str
    summary: str
    error: str | None = None
    exit_code: int | None = None
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None

    @classmethod
    def failed(cls, text: str) -> Record:
        return cls("failed", text, text)


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
    for key in _WORKER_KEYS:
        env.pop(f"STELLA_{key}", None)
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
        env["STELLA_PIPELINE_ENTRY"] = entry
    return env


def read_result(path: Path) -> PipelineResult | None:
    import json

    try:
        return PipelineResult.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


class Dispatcher:
    """Runs attempts for one fleet run; `execute` is thread-safe, one call per task."""

    def __init__(
        self,
        settings: RunSettings,
        ledger: Ledger,
        claims: ClaimStore,
        emit: Emit,
        *,
        launcher: Launcher | None = None,
    ) -> None:
        self.settings = settings
        self.launcher = launcher  # forks warm workers; None: each worker is a fresh interpreter
        self.ledger = ledger
        self.claims = claims
        self.emit = emit
        self._hard_stop = threading.Event()
        # Level-triggered wake-up for every waiting thread: written once, never read.
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        # Worked out once per run rather than per task: the environment every worker inherits, and the
        # directories of the run's results (os.environ is copied and sysconfig asked only here).
        self._env = run_env(settings)
        self._made: set[Path] = set()

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def stop_workers(self) -> None:
        """Stop every running worker's process tree (SIGTERM, SIGKILL after the grace period)."""
        if not self._hard_stop.is_set():
            self._hard_stop.set()
            os.write(self._wake_w, b"x")

    # --- one task ---

    def execute(self, task: PlanTask) -> bool:
        settings = self.settings
        run_id = settings.run_id
        pipeline = task.pipeline or settings.default_pipeline
        workspace = workspace_for(settings.root, run_id, task)
        paths = settings.paths
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
            self._running[task.id] = attempt_id
        started = time.monotonic()
        try:
            try:
                record = self._attempt(task, attempt_id, pipeline, workspace, log_path, transcript_path)
            except ClaimConflict as exc:
                record = Record.failed(str(exc))
            except StellaError as exc:
                record = Record.failed(f"could not start the worker: {exc}")
            except Exception as exc:  # a bug must still leave the ledger consistent
                record = Record.failed(f"internal error: {type(exc).__name__}: {exc}")
            reason = None if record.outcome == "succeeded" else (record.error or record.summary)
            spend = self.ledger.finish_attempt(
                attempt_id,
                outcome=record.outcome,
                exit_code=record.exit_code,
                summary=record.summary,
                error=record.error,
                cpu_seconds=record.cpu_seconds,
                peak_rss_bytes=record.peak_rss_bytes,
                reason=reason,
                transcript_written=transcript_path.exists(),
            )
        finally:
            self.claims.release_attempt_if_held(run_id, attempt_id)
            with self._lock:
                self._running.pop(task.id, None)
        self.emit(
            "attempt_end",
            {
                "task": task.id,
                "attempt": attempt_id,
                "outcome": record.outcome,
                "summary": record.summary,
                "error": record.error,
                "elapsed_s": time.monotonic() - started,
                "spend_usd": spend,
                "branch": workspace.branch,
            },
        )
        if record.outcome != "succeeded":
            raise TaskFailed(reason or record.outcome)
        return True

    def _make_dir(self, path: Path) -> None:
        if path not in self._made:  # one mkdir per directory per run, not per task
            path.mkdir(parents=True, exist_ok=True)
            self._made.add(path)

    def _attempt(
        self,
        task: PlanTask,
        attempt_id: int,
        pipeline: str,
        workspace: Workspace,
        log_path: Path,
        transcript_path: Path,
    ) -> Record:
        settings = self.settings
        if self._hard_stop.is_set():
            return Record("interrupted", "interrupted before the worker started", "interrupted")
        if task.claims:
            holder = Holder.current(settings.run_id, task.id, task.title, attempt_id)
            self.claims.acquire(claim_keys(settings.root, workspace, task.claims), holder)
        if workspace.isolated:
            assert workspace.branch is not None
            worktrees.worktree_add(settings.root, workspace.path, workspace.branch, settings.base_commit)
            self.ledger.set_task_workspace(settings.run_id, task.id, workspace.branch, str(workspace.path))
        ctx = WorkerContext(
            root=settings.root,
            workspace=workspace.path,
            run_id=settings.run_id,
            task_id=task.id,
            task_title=task.title,
            attempt_id=attempt_id,
            prompt=task.prompt,
            isolation="isolated" if workspace.isolated else "shared",
            branch=workspace.branch,
            base_commit=settings.base_commit,
            spend_guard_usd=settings.spend_guard_usd,
            pipeline=pipeline,
            model=task.model,
            timeout_s=task.timeout,
            result_path=settings.paths.result_file(settings.run_id, task.id, attempt_id),
            log_path=log_path,
            transcript_path=transcript_path,
        )
        self._make_dir(ctx.result_path.parent)
        self._make_dir(log_path.parent)
        tree = self._spawn(workspace.path, task_env(ctx, settings, self._env), log_path)
        try:
            self.ledger.set_attempt_pid(attempt_id, tree.pid)
            self.emit(
                "attempt_start",
                {
                    "task": task.id,
                    "title": task.title,
                    "attempt": attempt_id,
                    "pid": tree.pid,
                    "workspace": str(workspace.path),
                    "branch": workspace.branch,
                },
            )
            exit_info, stop_reason = self._wait(tree, task.timeout)
        finally:
            tree.close()
        if workspace.isolated:
            self._record_branch_commits(task, attempt_id, workspace)
        return self._judge(exit_info, stop_reason, read_result(ctx.result_path))

    def _spawn(self, cwd: Path, env: dict[str, str], log_path: Path) -> ProcessTree:
        launcher = self.launcher
        if launcher is not None:
            try:
                return ProcessTree.spawn(WORKER_ARGV, cwd=cwd, env=env, log_path=log_path, launcher=launcher)
            except LauncherGone:
                self.launcher = None  # from now on, every worker is a fresh interpreter
        return ProcessTree.spawn(WORKER_ARGV, cwd=cwd, env=env, log_path=log_path)

    def _wait(self, tree: ProcessTree, timeout: float | None) -> tuple[Exit, str | None]:
        """Wait for the worker, sampling its tree; stop it on timeout or a hard stop."""
        settings = self.settings
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        next_sample = start + min(0.1, settings.sample_interval_s)
        stop_reason: str | None = None
        stopped_at = 0.0
        killed = False
        while True:
            now = time.monotonic()
            if stop_reason is None:
                if deadline is not None and now >= deadline:
                    stop_reason = f"timed out after {timeout:g}s"
                elif self._hard_stop.is_set():
                    stop_reason = "interrupted"
                if stop_reason is not None:
                    tree.signal_tree(signal.SIGTERM)
                    stopped_at = now
            elif not killed and now - stopped_at >= settings.stop_grace_s:
                tree.signal_tree(signal.SIGKILL)
                killed = True
            if now >= next_sample:
                tree.sample()
                next_sample = now + settings.sample_interval_s
            wait_for = next_sample - now
            if stop_reason is None and deadline is not None:
                wait_for = min(wait_for, deadline - now)
            if stop_reason is not None and not killed:
                wait_for = min(wait_for, stopped_at + settings.stop_grace_s - now)
            done = tree.wait(max(wait_for, 0.001), wake_fd=None if stop_reason else self._wake_r)
            if done is not None:
                if stop_reason is not None:
                    tree.signal_tree(signal.SIGKILL)  # whatever of the stopped tree outlived its root
                return done, stop_reason

    @staticmethod
    def _judge(exit_info: Exit, stop_reason: str | None, result: PipelineResult | None) -> Record:
        measured: dict[str, Any] = {
            "exit_code": exit_info.returncode,
            "cpu_seconds": round(exit_info.cpu_seconds, 3),
            "peak_rss_bytes": exit_info.peak_rss_bytes or None,
        }
        if exit_info.returncode == 0 and result is not None and result.success:
            return Record("succeeded", result.summary or "done", None, **measured)
        if stop_reason is not None:
            outcome = "interrupted" if stop_reason == "interrupted" else "failed"
            error = f"{stop_reason} (worker {exit_info.describe()})"
            summary = result.summary if result is not None and result.summary else stop_reason
            return Record(outcome, summary, error, **measured)
        if result is None:
            error = (
                f"worker {exit_info.describe()}"
                if exit_info.returncode != 0
                else "worker exited without leaving a result"
            )
            return Record("failed", error, error, **measured)
        error = result.error or f"worker {exit_info.describe()}"
        return Record("failed", result.summary or error, error, **measured)

    def _record_branch_commits(self, task: PlanTask, attempt_id: int, workspace: Workspace) -> None:
        assert workspace.branch is not None
        settings = self.settings
        for commit in gitops.commits_between(settings.root, settings.base_commit, workspace.branch):
            self.ledger.record_commit(
                sha=commit.sha,
                run_id=settings.run_id,
                task_id=task.id,
                attempt_id=attempt_id,
                branch=workspace.branch,
                message=commit.message,
                committed_at_ms=commit.committed_at_ms,
            )
