"""One run, the control: prepare, record the run, drive the waves, settle, and the run's exit status.
The waves run in a background thread so the main thread only waits: Ctrl-C handling takes no locks."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from stellafleet.core.clock import Clock
from stellafleet.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SPEND_LIMIT,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    StellaError,
)
from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths
from stellafleet.core.spend import SpendBudget, overspent
from stellafleet.core.status import RunStatus, Stop, StopReason, TaskStatus
from stellafleet.core.words import plural
from stellafleet.git import dirty, gitops
from stellafleet.run.background import run_in_background
from stellafleet.run.events import Emit, Event, EventSink, Notice, RunStarted, TaskSkipped, WaveStarted
from stellafleet.run.executor import Executor, LocalExecutor
from stellafleet.run.expand import Expansions
from stellafleet.run.limiter import Limiter, LimitPolicy
from stellafleet.run.notify import fan_out, notifier_for
from stellafleet.run.prepare import FleetOptions, Prepared, prepare
from stellafleet.run.reporter import make_reporter, print_dry_run, result_document, status_counts
from stellafleet.run.resume import record_lineage, schedule_note
from stellafleet.run.steps import RunSettings, factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.run.watchdog import watching
from stellafleet.run.waves import PlanRunner
from stellafleet.state import journal
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


def run_fleet(
    options: FleetOptions,
    *,
    out: IO[str] | None = None,
    reporter: EventSink | None = None,
    clock: Clock | None = None,
) -> int:
    """`stella fleet` (and `stella run`, a fleet of one task): the exit code of the run (see errors.py)."""
    out = out or sys.stdout
    prepared = prepare(options)
    for warning in prepared.warnings:
        print(f"stella fleet: warning: {warning}", file=sys.stderr)
    for note in prepared.tree.notes:
        print(f"stella fleet: {note}", file=sys.stderr)
    if options.estimate:  # nothing runs: what the ledger's history says the run would cost and take
        from stellafleet.run.estimate import estimate, print_estimate

        with Ledger.open(StatePaths(prepared.root).fleet_db) as ledger:
            print_estimate(estimate(prepared, ledger), json_mode=options.json_mode, stream=out)
        return EXIT_OK
    if options.dry_run:
        print_dry_run(prepared.preview(), json_mode=options.json_mode, stream=out)
        return EXIT_USAGE if prepared.problems else EXIT_OK
    return FleetRun(prepared, reporter or make_run_reporter(prepared, out), clock=clock).run()


@dataclass
class Interrupts:
    """Ctrl-C once: launch nothing more and let running workers finish (unless the run stops them on the
    first). Twice (or SIGTERM, SIGHUP): stop their process trees."""

    request_stop: Callable[[Stop], None]
    stop_workers: Callable[[], None]
    running: Callable[[], Sequence[str]]
    emit: Emit
    stop_on_first: bool = False
    count: int = 0

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1
        running = plural(len(self.running()), "running worker")
        self.request_stop(Stop(StopReason.INTERRUPTED))
        if self.count == 1 and signum == signal.SIGINT and not self.stop_on_first:
            self.emit(
                Notice(
                    f"interrupt: launching nothing more; waiting for {running}; "
                    "press Ctrl-C again to stop them"
                )
            )
            return
        self.stop_workers()
        self.emit(Notice(f"interrupt: stopping {running}"))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # SIGHUP (the terminal closed) is a stop like SIGTERM, not a kill that orphans the run's workers
        stops = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
        previous = {signum: signal.signal(signum, self.handle) for signum in stops}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def exit_status(
    interrupted: bool, stopped: Stop | None, statuses: Mapping[str, TaskStatus], overspent: str | None = None
) -> tuple[RunStatus, int, str | None]:
    """The run's (status, exit code, reason) from how it ended (overspent: why its recorded total passed
    its spend limit, which is exit 3 however its tasks ended)."""
    if interrupted:
        return RunStatus.INTERRUPTED, EXIT_INTERRUPTED, StopReason.INTERRUPTED.value
    if stopped is not None and stopped.reason is StopReason.SPEND_LIMIT:
        return RunStatus.SPEND_LIMITED, EXIT_SPEND_LIMIT, str(stopped)
    if overspent is not None:
        return RunStatus.SPEND_LIMITED, EXIT_SPEND_LIMIT, overspent
    if stopped is not None and stopped.reason is StopReason.USAGE_LIMIT:  # exit 3 too: --resume goes on
        return RunStatus.USAGE_LIMITED, EXIT_SPEND_LIMIT, str(stopped)
    unsuccessful = status_counts(status for status in statuses.values() if status != TaskStatus.SUCCEEDED)
    if unsuccessful:
        return RunStatus.FAILED, EXIT_TASK_FAILED, unsuccessful
    return RunStatus.SUCCEEDED, EXIT_OK, None


def ensure_state_dirs(root: Path) -> StatePaths:
    paths = StatePaths(root)
    gitops.ensure_excluded(root, EXCLUDED_DIRS)
    for directory in (paths.private, paths.worktrees):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # SQLite writes -wal/-shm files beside the databases: refuse a read-only one now, not mid-run
            why = None if os.access(directory, os.W_OK | os.X_OK) else "not writable"
        except OSError as exc:
            why = exc.strerror or str(exc)
        if why is not None:
            raise StellaError(
                f"cannot write stella's state at {directory}: {why}; "
                "make it a writable directory and run again"
            )
    return paths


def make_run_reporter(prepared: Prepared, out: IO[str]) -> EventSink:
    def probe() -> tuple[Mapping[str, tuple[int, float]], float]:
        with Ledger.open(StatePaths(prepared.root).fleet_db, readonly=True) as ledger:
            return ledger.attempts.running_progress(prepared.run_id), ledger.spend.of_run(prepared.run_id)

    options = prepared.options
    return make_reporter(json_mode=options.json_mode, quiet=options.quiet, probe=probe, stream=out)


def run_settings(prepared: Prepared) -> RunSettings:
    """What every attempt of the prepared run shares."""
    return RunSettings(
        prepared.root,
        prepared.run_id,
        prepared.base_commit,
        default_pipeline=prepared.default_pipeline,
        default_model=prepared.options.model,  # for tasks that name none
        spend_guard_usd=prepared.spend_guard,
        config_file=prepared.config_file,
        config=prepared.config,
        allow_detached=prepared.options.allow_detached,
        start_points=prepared.start_points,
    )


class FleetRun:
    """One prepared run, from its ledger row to its result."""

    def __init__(self, prepared: Prepared, reporter: EventSink, *, clock: Clock | None = None) -> None:
        self.prepared = prepared
        self.clock = clock  # what the fleet waits with, held by provider limits (tests inject one)
        self.reporter = reporter
        notify = prepared.config.notify
        self.notifier = notifier_for(notify.command, notify.timeout, prepared.run_id, prepared.root)

    def run(self) -> int:
        p = self.prepared
        executor: Executor = LocalExecutor(stop_grace_s=p.config.fleet.stop_grace)
        if p.executor.kind == "ray":  # isolated tasks go to the cluster, shared ones stay with `executor`
            from stellafleet.run.rayexec import RayExecutor

            executor = RayExecutor.open(p, local=executor)
        try:
            paths = ensure_state_dirs(p.root)
            p.config.remember_checked(p.root)  # each worker then reads the config without checking it again
            if p.tree.changed:  # the user's changes at the start: kept out of the workers' commits
                dirty.save(p.root, p.run_id, dirty.take(p.root, p.tree.changed))
            with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as claims:
                journal.recover(p.root)  # what killed stella processes left: a fleet's run, a commit's lane
                journal.owner(p.root).write(f"fleet-{p.run_id}", "fleet", run_id=p.run_id)
                emit = fan_out(self.reporter.handle, self.notifier.handle if self.notifier else None)
                budget = spend_budget(p.spend_limit, p.concurrency.value, p.config)
                self._fix_parts = (claims, executor)  # --fix-ci's follow-up attempts run on these too
                try:
                    runner, interrupted = self._drive(ledger, claims, executor, emit, budget)
                    executor.release()  # nothing more to start: let it wind down while we finish
                    return self._finish(ledger, runner, interrupted)
                finally:
                    self.reporter.abort()  # after finish() a no-op; after an error it restores the terminal
        finally:
            executor.close()

    def _record_start(self, ledger: Ledger) -> None:
        """The run's row and its tasks' rows, then RunStarted."""
        p = self.prepared
        ledger.runs.create(
            run_id=p.run_id,
            plan_path=str(p.plan_path) if p.plan_path else None,
            plan_sha256=p.plan.sha256,
            base_ref=p.base_ref,
            base_commit=p.base_commit,
            max_concurrency=p.concurrency.value,
            spend_limit_usd=p.spend_limit,
            pipeline=p.run_pipeline,
            argv=list(p.options.argv),
            root=str(p.root),
            pid=os.getpid(),
            resumes=p.resume.run_id if p.resume else None,
            force=p.options.force,
        )
        # a task an earlier run did (--resume) is in no wave of this one
        waves = {task_id: number for number, wave in enumerate(p.waves, start=1) for task_id in wave}
        ledger.tasks.add(p.run_id, p.plan.tasks, waves)
        record_lineage(ledger, p.run_id, p.schedule, p.resume)  # with what the resumed run's tasks emitted
        self.reporter.handle(
            RunStarted(
                run_id=p.run_id,
                concurrency=p.concurrency.describe() + schedule_note(p.schedule, p.resume),
                base_ref=p.base_ref,
                base_commit=p.base_commit,
                tasks=p.plan.ids,
                waves=tuple(tuple(wave) for wave in p.waves),
                spend_limit_usd=p.spend_limit,
                spend_guard_usd=p.spend_guard,
                schedule=p.schedule,
                grows=any(task.expands for task in p.plan.tasks),
                done_in=p.resume.run_id if p.resume else None,
            )
        )

    def _drive(
        self, ledger: Ledger, claims: ClaimStore, executor: Executor, emit: Emit, budget: SpendBudget | None
    ) -> tuple[PlanRunner, bool]:
        """Record the run and run its tasks under the run's signal handling; (the runner, interrupted)."""
        p = self.prepared

        def on_event(event: Event) -> None:
            if isinstance(event, TaskSkipped):
                ledger.tasks.set_status(p.run_id, event.task, TaskStatus.SKIPPED, event.reason)
            elif isinstance(event, WaveStarted):  # the table numbers waves as the progress lines do
                ledger.tasks.set_wave(p.run_id, event.tasks, event.wave)
            self.reporter.handle(event)

        def before_start(number: int, task_ids: list[str]) -> Stop | None:
            if budget is None:  # no spend limit
                return None
            told = self.notifier.spend_limit_reached if self.notifier is not None else None
            why = budget.before_start(ledger.spend.of_run(p.run_id), told)
            return Stop(StopReason.SPEND_LIMIT, why) if why else None

        durations = None
        if p.schedule == "eager":  # how long the same tasks took before decides what starts first
            durations = ledger.history.past_durations(
                (task.id, task.prompt, task.pipeline or p.default_pipeline) for task in p.plan.tasks
            )
        expansions, limiter = self._expansions(ledger), self._limiter(ledger)
        with watching(p.config.fleet.idle_timeout, ledger) as watchdog:
            server = factory.server(
                run_settings(p), ledger, claims, executor, emit,
                budget=budget, limiter=limiter, expansions=expansions, watchdog=watchdog,
            )  # fmt: skip
            runner = PlanRunner(
                p.plan,
                p.concurrency.value,
                server.execute,
                schedule=p.schedule,
                durations=durations,
                before_start=before_start,
                on_event=on_event,
                done=p.resume.done if p.resume else frozenset(),
                gate=limiter,
                expansions=expansions,
            )
            interrupts = Interrupts(
                runner.request_stop,
                server.stop_workers,
                lambda: server.running,
                self.reporter.handle,
                stop_on_first=p.options.stop_on_first_interrupt,
            )
            with interrupts.installed():
                self._record_start(ledger)
                run_in_background(runner.run, on_interrupt=server.stop_workers, name="stella-waves")
        return runner, interrupts.count > 0

    def _expansions(self, ledger: Ledger) -> Expansions:
        """What the run's expanding tasks emit, checked and recorded (expand.py)."""
        p, fleet = self.prepared, self.prepared.config.fleet
        return Expansions(
            p.plan,
            ledger,
            p.run_id,
            max_emitted=fleet.max_emitted_tasks,
            max_depth=fleet.max_expand_depth,
            emitted=p.resume.emitted if p.resume else (),
            isolated_remote=p.executor.kind == "ray",
        )

    def _limiter(self, ledger: Ledger) -> Limiter | None:
        """The run's width and hold under provider limits (None under `[fleet] fleet_backoff = false`)."""
        p, fleet = self.prepared, self.prepared.config.fleet
        if not fleet.fleet_backoff:
            return None
        wait = p.options.wait_for_limits or fleet.wait_for_limits
        policy = LimitPolicy(wait=wait, max_wait=fleet.max_limit_wait)
        wall = time.time if self.clock is None else self.clock.now  # an injected clock is a wall clock
        emit = self.reporter.handle
        return Limiter(
            ledger, p.run_id, p.concurrency.value, policy=policy, emit=emit, clock=self.clock, wall=wall
        )

    def _finish(self, ledger: Ledger, runner: PlanRunner, interrupted: bool) -> int:
        """Settle every task, record the run's end (and its CI watch), report the result; the exit code."""
        p = self.prepared
        statuses = self._settle(ledger, runner.seen.reasons, interrupted)
        over = overspent(ledger.spend.of_run(p.run_id), p.spend_limit)
        status, code, reason = exit_status(interrupted, runner.stopped, statuses, over)
        ledger.runs.finish(p.run_id, status, exit_code=code, reason=reason)
        journal.owner(p.root).drop(f"fleet-{p.run_id}")
        journal.recover(p.root)  # a worker's `stella commit` stopped mid-lane: repaired now
        if self.notifier is not None:
            self.notifier.run_ended(status, code, reason, Counter(str(s) for s in statuses.values()))
        watch_doc = None
        if p.watch is not None and not interrupted:
            watch_doc, code = self._watch(ledger, status, code)
        self.reporter.finish(result_document(ledger.get_run(p.run_id), watch_doc))
        return code

    def _settle(self, ledger: Ledger, seen: Mapping[str, str], interrupted: bool) -> dict[str, TaskStatus]:
        """Task id -> its status in the ledger; a task whose attempt never got recorded ends skipped."""
        run_id = self.prepared.run_id
        by_status = {task["id"]: TaskStatus(task["status"]) for task in ledger.get_run(run_id)["tasks"]}
        for task_id, status in by_status.items():
            if status in (TaskStatus.PENDING, TaskStatus.RUNNING):
                reason = seen.get(task_id) or StopReason.NOT_STARTED.value
                reason = StopReason.INTERRUPTED.value if interrupted else reason
                ledger.tasks.set_status(run_id, task_id, TaskStatus.SKIPPED, reason)
                by_status[task_id] = TaskStatus.SKIPPED
                self.reporter.handle(TaskSkipped(task_id, reason))
        return by_status

    def _watch(self, ledger: Ledger, status: RunStatus, code: int) -> tuple[Any, int]:
        from stellafleet.ci.watch import watch_run

        p = self.prepared
        fixer = None
        if p.options.fix_ci:  # --fix-ci N: follow-up rounds per red branch (the parser wants --watch)
            from stellafleet.run.cifix import CiFixRounds

            claims, executor = self._fix_parts
            # the fix-ups' guards come out of what the run's workers left of the limit
            budget = spend_budget(
                p.spend_limit, p.concurrency.value, p.config, spent=ledger.spend.of_run(p.run_id)
            )
            server = factory.server(
                run_settings(p), ledger, claims, executor, lambda event: None, budget=budget
            )
            fixer = CiFixRounds(server, budget, max_rounds=p.options.fix_ci)
        result = watch_run(p.root, p.run_id, config=p.config, json_mode=p.options.json_mode, fixer=fixer)
        if code == EXIT_OK and result.exit_code != EXIT_OK:
            code = result.exit_code
            ledger.runs.finish(
                p.run_id, status, exit_code=code, reason="watch: a watched branch did not end green"
            )
        return result.to_json(), code
