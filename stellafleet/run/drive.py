"""The run's waves driven: its row recorded, its request server built through the one factory, doit's
PlanRunner in a background thread under the run's signal handling, the spend limit and provider limits."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from stellafleet.core.clock import Clock
from stellafleet.core.status import Stop, StopReason, TaskStatus
from stellafleet.git import dirty
from stellafleet.run.diskfull import FullDisk
from stellafleet.run.events import Emit, Event, EventSink, RunStarted, TaskSkipped, WaveStarted
from stellafleet.run.executor import Executor
from stellafleet.run.expand import Expansions
from stellafleet.run.interrupts import Interrupts
from stellafleet.run.limiter import Limiter, LimitPolicy
from stellafleet.run.notify import Notifier
from stellafleet.run.prepare import Prepared
from stellafleet.run.resume import record_lineage, schedule_note
from stellafleet.run.steps import factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.run.watchdog import watching
from stellafleet.run.waves import PlanRunner
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


@dataclass
class WaveDrive:
    """One prepared run's tasks, from its ledger row to the last wave."""

    prepared: Prepared
    reporter: EventSink
    notifier: Notifier | None
    clock: Clock | None  # what the fleet waits with, held by provider limits (tests inject one)

    def record_start(self, ledger: Ledger) -> None:
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

    def keep_users_changes(self) -> None:
        """The user's uncommitted changes at the start, kept out of the workers' commits."""
        p = self.prepared
        if p.tree.changed:
            dirty.save(p.root, p.run_id, dirty.take(p.root, p.tree.changed))

    def drive(
        self, ledger: Ledger, claims: ClaimStore, executor: Executor, emit: Emit
    ) -> tuple[PlanRunner, bool]:
        """Record the run and run its tasks under the run's signal handling; (the runner, interrupted)."""
        p = self.prepared
        budget = spend_budget(p.spend_limit, p.concurrency.value, p.config)

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
                p.run_settings(), ledger, claims, executor, emit,
                budget=budget, limiter=limiter, expansions=expansions, watchdog=watchdog,
            )  # fmt: skip
            full = FullDisk(p.root, p.run_id)  # a full disk stops the run (diskfull.py)
            runner = PlanRunner(
                p.plan,
                p.concurrency.value,
                full.guard(server.execute, lambda stop: runner.request_stop(stop), server.stop_workers),
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
                self.record_start(ledger)
                full.run(ledger, runner.run, on_interrupt=server.stop_workers)
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
