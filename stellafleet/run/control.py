"""One run, the control: prepare, record the run, drive the waves, settle, and the run's exit status.
The waves run in a background thread so the main thread only waits: Ctrl-C handling takes no locks."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from stellafleet.core.clock import Clock
from stellafleet.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARKED,
    EXIT_SPEND_LIMIT,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    StellaError,
)
from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths
from stellafleet.core.spend import overspent
from stellafleet.core.status import RunStatus, Stop, StopReason, TaskStatus
from stellafleet.git import gitops
from stellafleet.run.cifix import watch_after_run
from stellafleet.run.drive import WaveDrive
from stellafleet.run.events import EventSink, TaskSkipped
from stellafleet.run.notify import fan_out, notifier_for
from stellafleet.run.parked import parked_reason
from stellafleet.run.prepare import FleetOptions, Prepared, prepare
from stellafleet.run.rayexec import open_executor
from stellafleet.run.reporter import print_dry_run, result_document, run_reporter, status_counts
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
    reporter = reporter or run_reporter(
        prepared.root, prepared.run_id, json_mode=options.json_mode, quiet=options.quiet, out=out
    )
    return FleetRun(prepared, reporter, clock=clock).run()


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


class FleetRun:
    """One prepared run, from its ledger row to its result."""

    def __init__(self, prepared: Prepared, reporter: EventSink, *, clock: Clock | None = None) -> None:
        self.prepared = prepared
        self.reporter = reporter
        notify = prepared.config.notify
        self.notifier = notifier_for(notify.command, notify.timeout, prepared.run_id, prepared.root)
        self.waves = WaveDrive(prepared, reporter, self.notifier, clock)

    def run(self) -> int:
        p = self.prepared
        executor = open_executor(p)
        try:
            paths = ensure_state_dirs(p.root)
            p.config.remember_checked(p.root)  # each worker then reads the config without checking it again
            self.waves.keep_users_changes()
            with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as claims:
                journal.recover(p.root)  # what killed stella processes left: a fleet's run, a commit's lane
                journal.owner(p.root).write(f"fleet-{p.run_id}", "fleet", run_id=p.run_id)
                emit = fan_out(self.reporter.handle, self.notifier.handle if self.notifier else None)
                try:
                    runner, interrupted = self.waves.drive(ledger, claims, executor, emit)
                    executor.release()  # nothing more to start: let it wind down while we finish
                    self._parts = (claims, executor)  # --fix-ci's follow-up attempts run on these too
                    return self._finish(ledger, runner.stopped, runner.seen.reasons, interrupted)
                finally:
                    self.reporter.abort()  # after finish() a no-op; after an error it restores the terminal
        finally:
            executor.close()

    def _finish(
        self, ledger: Ledger, stopped: Stop | None, seen: Mapping[str, str], interrupted: bool
    ) -> int:
        """Settle every task, record the run's end (and its CI watch), report the result; the exit code."""
        p = self.prepared
        statuses = self._settle(ledger, seen, interrupted)
        over = overspent(ledger.spend.of_run(p.run_id), p.spend_limit)
        status, code, reason = exit_status(interrupted, stopped, statuses, over)
        parked = parked_reason(ledger.get_run(p.run_id)["tasks"]) if code == EXIT_TASK_FAILED else None
        if parked is not None:  # only tasks waiting on a person, and their dependents: --resume after answers
            status, code, reason = RunStatus.PARKED, EXIT_PARKED, parked
        ledger.runs.finish(p.run_id, status, exit_code=code, reason=reason)
        journal.owner(p.root).drop(f"fleet-{p.run_id}")
        journal.recover(p.root)  # a worker's `stella commit` stopped mid-lane: repaired now
        if self.notifier is not None:
            self.notifier.run_ended(status, code, reason, Counter(str(s) for s in statuses.values()))
        watch_doc = None
        if p.watch is not None and not interrupted:  # --fix-ci's follow-up attempts run on the run's parts
            watch_doc, code = watch_after_run(p, ledger, *self._parts, status, code)
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
