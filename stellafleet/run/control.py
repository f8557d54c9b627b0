"""Running a prepared fleet: record the run, drive the waves, settle the ledger, build the result.

fleet.py decides whether a run may start; this module carries it out once it has. The waves are driven
from a background thread so the main thread only waits, which keeps Ctrl-C handling free of locks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from stellafleet.core.errors import EXIT_OK, StellaError
from stellafleet.run.dispatch import Dispatcher, RunSettings
from stellafleet.run.prepare import (
    INTERRUPTED,
    SPEND_STOP_PREFIX,
    Interrupts,
    Prepared,
    ensure_state_dirs,
    exit_status,
    make_run_reporter,
)
from stellafleet.run.reporter import Reporter
from stellafleet.run.waves import WaveOutcome, WaveRunner
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger
from stellafleet.worker.launcher import Launcher

DEFAULT_STOP_GRACE_S = 5.0


def _number(config_value: Any, default: float, key: str) -> float:
    if config_value is None:
        return default
    if isinstance(config_value, bool) or not isinstance(config_value, int | float) or config_value < 0:
        raise StellaError(f"config: {key} must be a number of seconds >= 0, not {config_value!r}")
    return float(config_value)


def result_document(record: Mapping[str, Any], watch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine-readable result of a run (what `--json` prints), from the ledger's record of it."""
    run = record["run"]
    attempts_by_task: dict[str, list[dict[str, Any]]] = {}
    for attempt in record["attempts"]:
        attempts_by_task.setdefault(attempt["task_id"], []).append(
            {
                key: attempt[key]
                for key in (
                    "id",
                    "outcome",
                    "success",
                    "exit_code",
                    "started_at_ms",
                    "finished_at_ms",
                    "pid",
                    "spend_usd",
                    "input_tokens",
                    "output_tokens",
                    "steps",
                    "summary",
                    "error",
                    "cpu_seconds",
                    "peak_rss_bytes",
                    "branch",
                    "worktree",
                    "log_path",
                )
            }
        )
    commits_by_task: dict[str, list[str]] = {}
    branches: dict[str, dict[str, Any]] = {}
    for commit in record["commits"]:
        commits_by_task.setdefault(commit["task_id"], []).append(commit["sha"])
        if commit["branch"]:
            entry = branches.setdefault(
                commit["branch"], {"branch": commit["branch"], "tasks": [], "commits": 0}
            )
            entry["commits"] += 1
            if commit["task_id"] not in entry["tasks"]:
                entry["tasks"].append(commit["task_id"])
    tasks = []
    for task in record["tasks"]:
        attempts = attempts_by_task.get(task["id"], [])
        last = attempts[-1] if attempts else None
        if task["branch"] and task["branch"] not in branches:
            branches[task["branch"]] = {"branch": task["branch"], "tasks": [task["id"]], "commits": 0}
        tasks.append(
            {
                "id": task["id"],
                "title": task["title"],
                "wave": task["wave"],
                "status": task["status"],
                "reason": task["reason"],
                "isolation": task["isolation"],
                "pipeline": task["pipeline"] or run["pipeline"],
                "depends_on": task["depends_on"],
                "claims": task["claims"],
                "branch": task["branch"],
                "worktree": task["worktree"],
                "spend_usd": round(sum(a["spend_usd"] or 0.0 for a in attempts), 6),
                "summary": last["summary"] if last else None,
                "commits": commits_by_task.get(task["id"], []),
                "attempts": attempts,
            }
        )
    return {
        "run_id": run["id"],
        "status": run["status"],
        "exit_code": run["exit_code"],
        "reason": run["reason"],
        "base_ref": run["base_ref"],
        "base_commit": run["base_commit"],
        "max_concurrency": run["max_concurrency"],
        "spend_usd": round(run["spend_usd"] or 0.0, 6),
        "spend_limit_usd": run["spend_limit_usd"],
        "created_at_ms": run["created_at_ms"],
        "finished_at_ms": run["finished_at_ms"],
        "tasks": tasks,
        "branches": list(branches.values()),
        "watch": dict(watch) if watch is not None else None,
    }


class FleetRun:
    """One prepared run. `launcher` forks its workers (fleet.start_launcher); None: fresh interpreters.
    The run owns the launcher from here on and closes it."""

    def __init__(
        self,
        prepared: Prepared,
        *,
        out: IO[str],
        reporter: Reporter | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.prepared = prepared
        self.out = out
        self.launcher = launcher
        self.reporter = reporter or make_run_reporter(prepared, out)

    def _settings(self) -> RunSettings:
        p = self.prepared
        config_file = Path(p.opts.config_file).resolve() if p.opts.config_file else None
        return RunSettings(
            root=p.root,
            run_id=p.run_id,
            base_commit=p.base_commit,
            default_pipeline=p.default_pipeline,
            spend_guard_usd=p.spend_guard,
            config_file=config_file,
            pipeline_entries=p.pipeline_entries,
            stop_grace_s=_number(p.config.get("fleet.stop_grace"), DEFAULT_STOP_GRACE_S, "fleet.stop_grace"),
        )

    def run(self) -> int:
        launcher = self.launcher
        try:
            p = self.prepared
            paths = ensure_state_dirs(p.root)
            settings = self._settings()
            with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as claims:
                dispatcher = Dispatcher(settings, ledger, claims, self.reporter.event, launcher=launcher)
                try:
                    return self._run(ledger, dispatcher)
                finally:
                    abort = getattr(self.reporter, "abort", None)
                    if abort is not None:  # after finish() a no-op; after an error it restores the terminal
                        abort()
                    dispatcher.close()
        finally:
            if launcher is not None:
                launcher.close()

    def _run(self, ledger: Ledger, dispatcher: Dispatcher) -> int:
        p = self.prepared
        run_id = p.run_id
        limit = p.opts.spend_limit
        emit = self.reporter.event

        def on_event(name: str, data: dict[str, Any]) -> None:
            if name == "task_skipped":
                ledger.set_task_status(run_id, data["task"], "skipped", data.get("reason"))
            if name in ("wave_start", "wave_end", "task_skipped"):
                emit(name, data)

        def before_wave(number: int, task_ids: list[str]) -> str | None:
            if limit is None:
                return None
            spent = ledger.run_spend(run_id)
            if spent >= limit:
                return f"{SPEND_STOP_PREFIX}: ${spent:.2f} of ${limit:.2f}"
            return None

        runner = WaveRunner(
            p.plan, p.concurrency.value, dispatcher.execute, before_wave=before_wave, on_event=on_event
        )
        interrupts = Interrupts(
            runner.request_stop, dispatcher.stop_workers, lambda: dispatcher.running, emit
        )
        with interrupts.installed():
            ledger.create_run(
                run_id=run_id,
                plan_path=str(Path(p.opts.plan_path).resolve()) if p.opts.plan_path else None,
                plan_sha256=p.plan.sha256,
                base_ref=p.base_ref,
                base_commit=p.base_commit,
                max_concurrency=p.concurrency.value,
                spend_limit_usd=limit,
                pipeline=p.default_pipeline,
                argv=list(p.opts.argv),
                root=str(p.root),
                pid=os.getpid(),
            )
            ledger.add_tasks(run_id, p.plan.tasks, p.plan.wave_numbers(p.concurrency.value))
            emit(
                "run_start",
                {
                    "run_id": run_id,
                    "concurrency": p.concurrency.describe(),
                    "max_concurrency": p.concurrency.value,
                    "base_ref": p.base_ref,
                    "base_commit": p.base_commit,
                    "tasks": list(p.plan.ids),
                    "waves": p.waves,
                    "spend_limit_usd": limit,
                    "spend_guard_usd": p.spend_guard,
                },
            )
            outcome = self._drive(runner)
        if self.launcher is not None:
            self.launcher.release()  # it has no more workers to fork: let it wind down while we finish
        interrupted = interrupts.count > 0
        statuses = self._settle(ledger, outcome, interrupted)
        status, code, reason = exit_status(interrupted, outcome.stopped, statuses)
        ledger.finish_run(run_id, status, exit_code=code, reason=reason)
        watch_doc = None
        if p.opts.watch and not interrupted:
            watch_doc, code = self._watch(ledger, status, code)
        self.reporter.finish(result_document(ledger.get_run(run_id), watch_doc))
        return code

    @staticmethod
    def _drive(runner: WaveRunner) -> WaveOutcome:
        """Run the waves in a thread; the main thread only waits (and takes the signals)."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["outcome"] = runner.run()
            except BaseException as exc:  # handed back to the main thread below
                box["error"] = exc

        thread = threading.Thread(target=target, name="stella-waves", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
        if "error" in box:
            raise box["error"]
        outcome: WaveOutcome = box["outcome"]
        return outcome

    def _settle(self, ledger: Ledger, outcome: WaveOutcome, interrupted: bool) -> dict[str, str]:
        """Make every task's final status explicit; returns task id -> status."""
        run_id = self.prepared.run_id
        record = ledger.get_run(run_id)
        by_status = {task["id"]: task["status"] for task in record["tasks"]}
        for task in record["tasks"]:
            task_id = task["id"]
            if task["status"] in ("pending", "running"):  # never launched: the stop came first
                reason = outcome.reasons.get(task_id) or outcome.stopped or "not started"
                if interrupted:
                    reason = INTERRUPTED
                ledger.set_task_status(run_id, task_id, "skipped", reason)
                by_status[task_id] = "skipped"
                self.reporter.event("task_skipped", {"task": task_id, "reason": reason})
            elif task["status"] == "skipped" and interrupted and self._after_interrupt(task, by_status):
                ledger.set_task_status(run_id, task_id, "skipped", INTERRUPTED)
        return by_status

    @staticmethod
    def _after_interrupt(task: Mapping[str, Any], by_status: Mapping[str, str]) -> bool:
        """A task skipped only because a dependency was interrupted was skipped by the interrupt."""
        reason = task.get("reason") or ""
        return reason.startswith("dependency failed") and any(
            by_status.get(dep) in ("interrupted", "skipped") for dep in task.get("depends_on", [])
        )

    def _watch(self, ledger: Ledger, status: str, code: int) -> tuple[Any, int]:
        from stellafleet.ci.watch import watch_run

        p = self.prepared
        result = watch_run(p.root, p.run_id, config=p.config, json_mode=p.opts.json_mode)
        if code == EXIT_OK and result.exit_code != EXIT_OK:
            code = result.exit_code
            ledger.finish_run(
                p.run_id, status, exit_code=code, reason="watch: a watched branch did not end green"
            )
        return result.to_json(), code
