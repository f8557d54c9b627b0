"""One task's attempt, through the run's steps (steps/): admitted, recorded, started, ended, released;
whatever happens in between, the ledger is left consistent and what the steps took is released."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from stellafleet.core import jsontext
from stellafleet.core.errors import ClaimConflict, DiskFull, StellaError
from stellafleet.core.status import AttemptEnd, AttemptOutcome, StopReason
from stellafleet.core.workercontext import WorkerContext
from stellafleet.plan.model import PlanTask
from stellafleet.run.events import AttemptEnded, AttemptStarted, Emit
from stellafleet.run.executor import FACTS_VAR, Attempt, Execution, Executor, inherited_env
from stellafleet.run.steps import (
    AttemptFailed,
    AttemptState,
    AttemptStep,
    FollowUp,
    Request,
    RunSettings,
    workspace_for,
)
from stellafleet.state.ledger import Ledger
from stellafleet.state.proof import new_token


class Attempted(NamedTuple):
    end: AttemptEnd
    attempt_id: int
    follow_up: FollowUp | None


def run_env(settings: RunSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every worker of the run inherits: base (default: os.environ) with the run's config file."""
    env = inherited_env(os.environ if base is None else base)
    if settings.config_file is not None:
        env["STELLA_CONFIG"] = str(settings.config_file)
    return env


def task_env(ctx: WorkerContext, inherited: Mapping[str, str]) -> dict[str, str]:
    """One worker's environment: the run's and its task's. In the shared tree git takes no optional
    locks (unless the user says), so an agent's `git status` never holds the index.lock others meet."""
    shared = {"GIT_OPTIONAL_LOCKS": "0"} if ctx.shared and "GIT_OPTIONAL_LOCKS" not in inherited else {}
    return {**inherited, **shared, **ctx.to_env()}


class Dispatcher:
    """Runs attempts for one fleet run; `execute` is thread-safe, one call per task."""

    def __init__(
        self,
        settings: RunSettings,
        ledger: Ledger,
        executor: Executor,
        emit: Emit,
        steps: Sequence[AttemptStep],
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.executor = executor
        self.emit = emit
        self.steps = tuple(steps)  # built by steps/factory.py
        self._hard_stop = threading.Event()
        self._lock = threading.RLock()  # re-entrant: a signal handler may interrupt a holder
        # shared-tree tasks with claims claim and start one at a time: a conflicting one fails after the
        # holder's "started" line
        self._claiming = threading.Lock()
        self._running: dict[str, Execution | None] = {}  # task id -> its worker, once started
        self._env = run_env(settings)  # what every worker of the run inherits

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

    def attempt(self, task: PlanTask, request: Request | None = None) -> Attempted:
        """One attempt of task (serving request, a follow-up taken by the server): how it ended, and the
        follow-up its steps asked for as they released it."""
        state = AttemptState(task, self._hard_stop, request, prompt=task.prompt)
        admitted: list[AttemptStep] = []
        started = time.monotonic()
        try:
            for step in self.steps:
                step.admit(state)
                admitted.append(step)
            taken = state.request  # the server's, or one a step took up as it admitted the attempt (Park)
            if taken is not None and taken.follow_up.context:  # after the task's own words
                state.prompt = f"{state.prompt.rstrip()}\n\n---\n{taken.follow_up.context}"
            ctx = state.context = self._open(state)
            end = self._run(state)
            state.spend = self.ledger.attempts.finish(
                ctx.attempt_id, end, transcript_written=ctx.transcript_path.exists()
            )
            for key, value in end.facts.items():
                self.ledger.facts.set(ctx.attempt_id, key, value)
            state.recorded = end
            elapsed = time.monotonic() - started
            self.emit(AttemptEnded(ctx.task_id, ctx.attempt_id, end, elapsed, state.spend))
        finally:
            follow_up = self._release(state, admitted)
        return Attempted(end, ctx.attempt_id, follow_up)

    def _release(self, attempt: AttemptState, admitted: list[AttemptStep]) -> FollowUp | None:
        """Every admitted step released, in reverse order, each whatever the others raised (the first
        exception is raised after); the first follow-up a step asked for."""
        with self._lock:
            self._running.pop(attempt.task.id, None)
        error: BaseException | None = None
        asked: FollowUp | None = None
        for step in reversed(admitted):
            try:
                wanted = step.released(attempt)
            except BaseException as exc:
                error = error or exc
                continue
            asked = asked or wanted
        if error is not None:
            raise error
        return asked

    def _open(self, attempt: AttemptState) -> WorkerContext:
        """The attempt's ledger row (its task now `running`) and what its worker will be told."""
        settings, task = self.settings, attempt.task
        run_id, paths = settings.run_id, settings.paths
        pipeline = task.pipeline or settings.default_pipeline
        workspace = workspace_for(settings.root, run_id, task)
        log_path = paths.log_file(run_id, task.id)
        transcript_path = paths.transcript_file(run_id, task.id)
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
            guard_usd=attempt.guard,
        )
        with self._lock:
            self._running[task.id] = None
        if attempt.request is not None:
            self.ledger.attempts.set_reason(attempt_id, attempt.request.follow_up.reason)
            self.ledger.requests.serving(attempt.request.id, attempt_id)
        return WorkerContext(
            root=settings.root,
            workspace=workspace.path,
            run_id=run_id,
            task_id=task.id,
            task_title=task.title,
            attempt_id=attempt_id,
            prompt=attempt.prompt,
            isolation="isolated" if workspace.isolated else "shared",
            branch=workspace.branch,
            base_commit=settings.base_commit,
            spend_guard_usd=attempt.guard,
            pipeline=pipeline,
            model=task.model or settings.default_model,
            timeout_s=task.timeout,
            result_path=paths.result_file(run_id, task.id, attempt_id),
            log_path=log_path,
            transcript_path=transcript_path,
            prompt_path=paths.prompt_file(run_id, task.id, attempt_id),
            token=token,
            plan_out=paths.fragment_file(run_id, task.id, attempt_id) if task.expands else None,
            commit_hooks=settings.config.commit.hooks,
            allow_detached=settings.allow_detached or settings.config.fleet.allow_detached,
            serialize_hooks=settings.serialize_hooks,
        )

    def _run(self, attempt: AttemptState) -> AttemptEnd:
        """The worker started and waited for, through the steps; the end to record, whatever went wrong."""
        ctx = attempt.ctx
        if self._hard_stop.is_set():
            summary = "interrupted before the worker started"
            return AttemptEnd(AttemptOutcome.INTERRUPTED, summary, StopReason.INTERRUPTED.value)
        try:
            attempt.remote = ctx.branch is not None and self.executor.runs_remotely(ctx)
            in_turn = bool(attempt.task.claims) and ctx.branch is None
            with self._claiming if in_turn else contextlib.nullcontext():
                execution = self._launch(attempt)
            end = execution.wait()
            for step in self.steps:
                end = step.ended(attempt, end)
            return end
        except AttemptFailed as exc:  # a step could not ready it: no worker started
            return exc.end
        except (ClaimConflict, DiskFull) as exc:  # their own words say what to do
            return AttemptEnd.failed(str(exc))
        except StellaError as exc:
            return AttemptEnd.failed(f"could not start the worker: {exc}")
        except Exception as exc:  # a bug must still leave the ledger consistent
            return AttemptEnd.failed(f"internal error: {type(exc).__name__}: {exc}")

    def _launch(self, attempt: AttemptState) -> Execution:
        """The steps before the start, the worker started, the steps once it started, AttemptStarted."""
        ctx = attempt.ctx
        attempt.env = task_env(ctx, self._env)
        for step in self.steps:
            step.before_start(attempt)
        facts = self.ledger.facts.of_task(self.settings.run_id, attempt.task.id)  # steps' and earlier ones'
        if facts:
            attempt.env[FACTS_VAR] = jsontext.dumps(facts)
        ctx = attempt.ctx  # a step may have set where its worktree starts
        for path in (ctx.result_path, ctx.log_path, ctx.plan_out, ctx.prompt_path):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
        if ctx.prompt_path is not None:  # however large, the prompt reaches the worker in a file
            ctx.prompt_path.write_text(ctx.prompt, encoding="utf-8")
        execution = self.executor.start(Attempt(ctx, attempt.env))
        with self._lock:  # one that starts as the run is being stopped is stopped at once
            self._running[ctx.task_id] = execution
            stopping = self._hard_stop.is_set()
        if stopping:
            execution.stop()
        if execution.pid is not None:
            self.ledger.attempts.set_pid(ctx.attempt_id, execution.pid)
        try:
            for step in self.steps:
                step.started(attempt, execution)
        except BaseException:  # no worker is left running unrecorded
            execution.stop()
            execution.wait()
            raise
        self.emit(
            AttemptStarted(
                task=ctx.task_id,
                title=ctx.task_title,
                pid=execution.pid,
                branch=ctx.branch,
                log_path=ctx.log_path,
                result_path=ctx.result_path,
            )
        )
        return execution
