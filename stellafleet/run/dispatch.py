"""One task's attempt: claims -> workspace -> executor -> record -> release.

`Dispatcher.execute` is the action the wave runner calls in a thread per task. It always leaves the
ledger consistent (the attempt finished, the task's status set) and always releases the attempt's claims,
whatever happens in between; a task that did not succeed raises TaskFailed with the reason. Where and how
the worker itself runs is the executor's business (executor.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stellafleet.core.config import Config
from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import ClaimConflict, StellaError
from stellafleet.core.limits import LimitKind, kind_of
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import NoBudget, SpendBudget, settle_attempt, task_guard
from stellafleet.core.status import AttemptEnd, AttemptOutcome, Stop, StopReason
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, submodules, worktrees
from stellafleet.pipelines.command import reported_usd
from stellafleet.plan.model import PlanTask
from stellafleet.run import bootstrap
from stellafleet.run.events import AttemptEnded, AttemptStarted, Emit, SkipTask
from stellafleet.run.executor import Attempt, Execution, Executor, inherited_env
from stellafleet.run.expand import Expansions
from stellafleet.run.limiter import Limiter
from stellafleet.run.salvaging import salvage_attempt
from stellafleet.run.watchdog import Watchdog
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.state.proof import new_token

# How many times a task whose attempt failed on a rate limit (its CLI gave up) is run again after the hold.
RATE_RERUNS = 2


class TaskFailed(Exception):
    """A task's attempt did not succeed; the message is the reason shown and recorded."""


MIXED_PIPELINES = "mixed"  # runs.pipeline of a run whose tasks use more than one pipeline


def recorded_default_pipeline(run: Mapping[str, object], config: Config) -> str:
    """The pipeline a follow-up task of a recorded run (a CI fix-up, a merge resolve) runs with: the run's
    one pipeline, else (a run of several, or none recorded) the config's."""
    pipeline = run.get("pipeline")
    return str(pipeline) if pipeline and pipeline != MIXED_PIPELINES else config.fleet.pipeline


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
    commit_hooks: str = "run"  # [commit] hooks, handed to every worker's `stella commit`
    allow_detached: bool = False  # --allow-detached: shared commits may go onto a detached HEAD
    init_submodules: bool = True  # [fleet] init_submodules, for isolated worktrees
    # [worktree]: the include limit and the setup command (bootstrap.py)
    worktree: WorktreeConfig = field(default_factory=WorktreeConfig)
    # task id -> the commit its new worktree starts from, instead of base_commit (--from-salvage)
    start_points: Mapping[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)


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
    """What every worker of the run inherits: base (default: this process's environment) as
    executor.inherited_env leaves it, with the run's config file."""
    env = inherited_env(os.environ if base is None else base)
    if settings.config_file is not None:
        env["STELLA_CONFIG"] = str(settings.config_file)
    return env


def task_env(ctx: WorkerContext, inherited: Mapping[str, str]) -> dict[str, str]:
    """One worker's environment: the run's (run_env) and its task's. In the shared tree, its git takes
    no optional locks unless the user says otherwise: an agent's `git status` then never holds the
    index.lock the user's own git (and the commit lane) would meet."""
    shared = {"GIT_OPTIONAL_LOCKS": "0"} if ctx.shared and "GIT_OPTIONAL_LOCKS" not in inherited else {}
    return {**inherited, **shared, **ctx.to_env()}


def spend_budget(
    limit: float | None, concurrency: int, config: Config, *, spent: float = 0.0
) -> SpendBudget | None:
    """A run's spend limit as its workers' guards, less what the run has spent (None: no limit)."""
    if limit is None:
        return None
    return SpendBudget(limit, concurrency, min_guard=config.governor.min_guard_usd, spent=spent)


class Dispatcher:
    """Runs attempts for one fleet run; `execute` is thread-safe, one call per task."""

    def __init__(
        self,
        settings: RunSettings,
        ledger: Ledger,
        claims: ClaimStore,
        executor: Executor,
        emit: Emit,
        *,
        budget: SpendBudget | None = None,
    ) -> None:
        self.settings = settings
        self.budget = budget  # under a spend limit: each worker's guard (settings.spend_guard_usd otherwise)
        self.ledger = ledger
        self.claims = claims
        self.executor = executor
        self.emit = emit
        self._hard_stop = threading.Event()
        self._lock = threading.RLock()  # re-entrant: a signal handler may interrupt a holder
        # Shared-tree tasks with claims take their claims and start their worker one at a time: a task
        # whose claim conflicts then sees the holder's worker (not the fleet holding for it) and fails
        # after the holder's "started" line.
        self._claiming = threading.Lock()
        self._running: dict[str, Execution | None] = {}  # task id -> its worker, once started
        self._env = run_env(settings)  # what every worker of the run inherits
        self.watchdog: Watchdog | None = None  # stops workers that show no progress (watchdog.py)
        self.limiter: Limiter | None = None  # the run's width under provider limits (limiter.py)
        self._reruns: dict[str, int] = {}  # task id -> attempts run again after a rate limit ended one
        self.expansions: Expansions | None = None  # checks and records what expanding tasks emit (expand.py)
        self._indexes = bootstrap.WorktreeIndexes()  # STELLA_WORKTREE_INDEX of the live worktrees

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

    def execute(self, task: PlanTask, *, reason: str | None = None) -> bool:
        """One attempt of task; with a reason (`ci-fix`) a follow-up one, in the task's existing worktree."""
        guard = self._guard(task)
        started = time.monotonic()
        spend: float | None = None
        try:
            ctx = self._open_attempt(task, guard)
        except BaseException:
            self._release_guard(task.id, None)
            raise
        if reason is not None:
            self.ledger.attempts.set_reason(ctx.attempt_id, reason)
        try:
            try:
                end = self._attempt(task, ctx, follow_up=reason is not None)
                if end.reason is None and self.expansions is not None:
                    end = self.expansions.settle(task, ctx.plan_out, end)
            except ClaimConflict as exc:
                end = AttemptEnd.failed(str(exc))
            except StellaError as exc:
                end = AttemptEnd.failed(f"could not start the worker: {exc}")
            except Exception as exc:  # a bug must still leave the ledger consistent
                end = AttemptEnd.failed(f"internal error: {type(exc).__name__}: {exc}")
            spend = self.ledger.attempts.finish(
                ctx.attempt_id, end, transcript_written=ctx.transcript_path.exists()
            )
        finally:
            self.claims.release_attempt_if_held(ctx.run_id, ctx.attempt_id)
            with self._lock:
                self._running.pop(task.id, None)
            self._indexes.release(task.id)
            self._release_guard(task.id, spend)
        elapsed = time.monotonic() - started
        self.emit(AttemptEnded(task.id, ctx.attempt_id, end, elapsed, spend))
        if self.limiter is not None and self._limited(task, ctx.attempt_id, end):
            return self.execute(task, reason="limit")
        if end.reason is not None:
            raise TaskFailed(end.reason)
        return True

    def _guard(self, task: PlanTask) -> float | None:
        """The task's worker's guard: its share of the run's budget (held until it ends), at most the
        task's max_spend; SkipTask when the budget has too little left."""
        guard = self.settings.spend_guard_usd
        if self.budget is not None:
            try:
                guard = self.budget.reserve(task.id)
            except NoBudget as exc:
                raise SkipTask(Stop(StopReason.SPEND_LIMIT, str(exc))) from None
        return task_guard(guard, task.max_spend)

    def _limited(self, task: PlanTask, attempt_id: int, end: AttemptEnd) -> bool:
        """Tell the limiter the attempt ended. One that failed on a usage limit runs again after its reset
        under --wait-for-limits (True), else its task is skipped with the reset (SkipTask); one that failed
        because its CLI gave up on a rate limit runs again once the hold is over (at most RATE_RERUNS)."""
        assert self.limiter is not None
        rows = self.limiter.attempt_ended(attempt_id)
        if not rows or end.reason is None:
            return False
        usage = next((row for row in rows if row["kind"] == LimitKind.USAGE), None)
        if usage is not None:
            if self.limiter.wait_for_reset(usage):
                return True
            raise SkipTask(self.limiter.usage_stop(usage))
        with self._lock:
            reruns = self._reruns.get(task.id, 0)
            if kind_of(None, None, end.reason) is None or reruns >= RATE_RERUNS:
                return False
            self._reruns[task.id] = reruns + 1
        self.limiter.wait_out_hold()
        return True

    def _release_guard(self, task_id: str, spend: float | None) -> None:
        """The task's worker ended: its guard is free again, what it spent counts."""
        if self.budget is not None:
            self.budget.release(task_id, spend)

    def _open_attempt(self, task: PlanTask, guard: float | None) -> WorkerContext:
        """The attempt's ledger row (its task now `running`) and what its worker will be told."""
        settings = self.settings
        run_id, paths = settings.run_id, settings.paths
        pipeline = task.pipeline or settings.default_pipeline
        workspace = workspace_for(settings.root, run_id, task)
        log_path = paths.log_file(run_id, task.id)
        transcript_path = paths.transcript_file(run_id, task.id)
        # The task's rows change in two write transactions (three with the worker's pid): the attempt
        # and the task `running` together, then the attempt's end and the task's status together.
        token, token_sha256 = new_token()  # proves `stella commit` runs inside this attempt (state/proof.py)
        attempt_id = self.ledger.attempts.start(
            run_id,
            task.id,
            pipeline=pipeline,
            branch=workspace.branch,
            worktree=str(workspace.path) if workspace.isolated else None,
            log_path=str(log_path),
            transcript_path=str(transcript_path),
            token_sha256=token_sha256,
            guard_usd=guard,
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
            prompt=self._prompt(task),
            isolation="isolated" if workspace.isolated else "shared",
            branch=workspace.branch,
            base_commit=settings.base_commit,
            spend_guard_usd=guard,
            pipeline=pipeline,
            model=task.model or settings.default_model,
            timeout_s=task.timeout,
            result_path=paths.result_file(run_id, task.id, attempt_id),
            log_path=log_path,
            transcript_path=transcript_path,
            prompt_path=paths.prompt_file(run_id, task.id, attempt_id),
            token=token,
            plan_out=paths.fragment_file(run_id, task.id, attempt_id) if task.expands else None,
            commit_hooks=settings.commit_hooks,
            allow_detached=settings.allow_detached,
        )

    def _prompt(self, task: PlanTask) -> str:
        """The task's prompt; one whose worktree starts from a salvage commit is told so first."""
        start = self.settings.start_points.get(task.id)
        if start is None or task.isolation != "isolated":
            return task.prompt
        return (
            f"Your worktree starts from commit {start[:12]}, the work an earlier attempt of this task left "
            "uncommitted when it stopped (salvaged by stella): review it and continue from there "
            "rather than starting over.\n\n" + task.prompt
        )

    def _attempt(self, task: PlanTask, ctx: WorkerContext, *, follow_up: bool = False) -> AttemptEnd:
        if self._hard_stop.is_set():
            summary = "interrupted before the worker started"
            return AttemptEnd(AttemptOutcome.INTERRUPTED, summary, StopReason.INTERRUPTED.value)
        workspace = Workspace(ctx.workspace, ctx.branch)
        in_turn = bool(task.claims) and workspace.branch is None
        remote = workspace.isolated and self.executor.runs_remotely(ctx)
        with self._claiming if in_turn else contextlib.nullcontext():
            execution = self._launch(task, ctx, workspace, follow_up=follow_up, remote=remote)
        if isinstance(execution, AttemptEnd):  # its worktree could not be readied: no worker started
            return execution
        if self.watchdog is not None:
            self.watchdog.watch(ctx, execution)
        try:
            end = execution.wait()
        finally:
            stalled = self.watchdog.forget(ctx.attempt_id) if self.watchdog is not None else None
        settle_attempt(self.ledger.spend, ctx.attempt_id, (end.claimed_usd, reported_usd(ctx)))
        end = end.stalled(stalled) if stalled else end
        if end.outcome != AttemptOutcome.SUCCEEDED and not remote:
            self._salvage(ctx, workspace, end)
        if workspace.branch is not None:
            self._record_branch_commits(ctx, workspace.branch)
        return end

    def _launch(
        self, task: PlanTask, ctx: WorkerContext, workspace: Workspace, *, follow_up: bool, remote: bool
    ) -> Execution | AttemptEnd:
        """Claims, workspace, the worker started (its claims handed to it), AttemptStarted; the failed end
        instead when a new worktree cannot be readied (bootstrap.py)."""
        settings = self.settings
        if task.claims:
            holder = Holder.current(ctx.run_id, task.id, task.title, ctx.attempt_id)
            self.claims.acquire(claim_keys(settings.root, workspace, task.claims), holder)
        ctx.result_path.parent.mkdir(parents=True, exist_ok=True)
        if ctx.plan_out is not None:
            ctx.plan_out.parent.mkdir(parents=True, exist_ok=True)
        ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = task_env(ctx, self._env)
        if workspace.isolated:
            env[bootstrap.INDEX_VAR] = str(self._indexes.take(task.id))
        if workspace.branch is not None and not follow_up:
            failed = self._new_worktree(ctx, workspace.branch, env, remote=remote)
            if failed is not None:
                return failed
        if ctx.prompt_path is not None:  # however large, the prompt reaches the worker in a file
            ctx.prompt_path.parent.mkdir(parents=True, exist_ok=True)
            ctx.prompt_path.write_text(ctx.prompt, encoding="utf-8")
        execution = self._start(ctx, env)
        if execution.pid is not None:
            self.ledger.attempts.set_pid(ctx.attempt_id, execution.pid)
            if task.claims:
                self._hand_over_claims(ctx, execution.pid)
        self.emit(
            AttemptStarted(
                task=task.id,
                title=task.title,
                pid=execution.pid,
                branch=workspace.branch,
                log_path=ctx.log_path,
                result_path=ctx.result_path,
            )
        )
        return execution

    def _new_worktree(
        self, ctx: WorkerContext, branch: str, env: Mapping[str, str], *, remote: bool
    ) -> AttemptEnd | None:
        """The task's worktree from its start point, readied (bootstrap.py); a failed end if it cannot be."""
        settings = self.settings
        if remote:  # it works in a clone on another machine; its branch comes back from there
            self.ledger.tasks.set_workspace(ctx.run_id, ctx.task_id, branch, None)
            return None
        start = settings.start_points.get(ctx.task_id, settings.base_commit)
        worktrees.worktree_add(settings.root, ctx.workspace, branch, start)
        if settings.init_submodules:
            submodules.init_in_worktree(settings.root, ctx.workspace)
        self.ledger.tasks.set_workspace(ctx.run_id, ctx.task_id, branch, str(ctx.workspace))
        try:
            readied = bootstrap.ready(
                settings.root, ctx.workspace, settings.worktree, env, ctx.log_path, self._hard_stop
            )
        except bootstrap.SetupFailed as exc:
            if exc.seconds is not None:
                self.ledger.attempts.set_setup(ctx.attempt_id, exc.seconds)
            if self._hard_stop.is_set():
                return AttemptEnd(AttemptOutcome.INTERRUPTED, str(exc), StopReason.INTERRUPTED.value)
            return AttemptEnd.failed(str(exc))
        if readied.setup_s is not None:
            self.ledger.attempts.set_setup(ctx.attempt_id, readied.setup_s)
        return None

    def _salvage(self, ctx: WorkerContext, workspace: Workspace, end: AttemptEnd) -> None:
        """Keep what the unfinished attempt left uncommitted (salvaging.py): its worktree, or its claims."""
        claimed = [] if workspace.isolated else self.claims.paths_of_attempt(ctx.run_id, ctx.attempt_id)
        salvage_attempt(
            self.ledger,
            root=self.settings.root,
            run_id=ctx.run_id,
            task_id=ctx.task_id,
            attempt_id=ctx.attempt_id,
            worktree=workspace.path if workspace.isolated else None,
            claimed=claimed,
            outcome=str(end.outcome),
        )

    def _hand_over_claims(self, ctx: WorkerContext, pid: int) -> None:
        """The declared claims are held by the worker from now on (they outlive a killed fleet with it)."""
        with contextlib.suppress(StellaError):  # a worker that already ended: the fleet keeps holding them
            worker = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id, pid)
            self.claims.hand_over(ctx.run_id, ctx.attempt_id, worker)

    def _start(self, ctx: WorkerContext, env: dict[str, str]) -> Execution:
        """Start the worker; one that starts as the run is being stopped is stopped at once."""
        execution = self.executor.start(Attempt(ctx, env))
        with self._lock:
            self._running[ctx.task_id] = execution
            stopping = self._hard_stop.is_set()
        if stopping:
            execution.stop()
        return execution

    def _record_branch_commits(self, ctx: WorkerContext, branch: str) -> None:
        for commit in gitops.commits_between(ctx.root, ctx.base_commit, branch):
            self.ledger.commits.record(
                sha=commit.sha,
                run_id=ctx.run_id,
                task_id=ctx.task_id,
                attempt_id=ctx.attempt_id,
                branch=branch,
                message=commit.message,
                committed_at_ms=commit.committed_at_ms,
            )
