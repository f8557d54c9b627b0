"""Build fleet ledgers with realistic content through the Ledger API (tests, docs screenshots, benches)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.core.status import (
    AttemptEnd,
    AttemptOutcome,
    CIState,
    FollowUpReason,
    RequestState,
    RunStatus,
    TaskStatus,
)
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger


def sample_task(task_id: str, prompt: str = "do it", title: str = "", **fields: Any) -> PlanTask:
    """A plan task for a hand-built ledger (the prompt and title matter little there)."""
    return PlanTask(task_id, prompt, title, **fields)


def leave_for_you(
    ledger: Ledger,
    run_id: str,
    task_id: str | None,
    text: str,
    *,
    attempt: int | None = None,
    branch: str | None = None,
    reason: FollowUpReason = FollowUpReason.RETRY,
) -> int:
    """The needs_you request the fleet's server leaves for a task that failed (or the watch for a branch left
    red: reason ci-fix): what the attention strip and `stella runs` show as waiting on a person."""
    return ledger.requests.ask(
        run_id, task_id, reason, text, asked_by="watch" if reason == FollowUpReason.CI_FIX else "fleet",
        branch=branch, from_attempt=attempt, state=RequestState.NEEDS_YOU,
    )  # fmt: skip


def add_run(ledger: Ledger, run_id: str, **fields: Any) -> str:
    """ledger.runs.create with a plain value for every field not given: no plan and no spend limit, the
    command pipeline, base commit 000..., owned by this process. Returns run_id."""
    values: dict[str, Any] = {
        "plan_path": None,
        "plan_sha256": None,
        "base_ref": "main",
        "base_commit": "0" * 40,
        "max_concurrency": 1,
        "spend_limit_usd": None,
        "pipeline": "command",
        "argv": ["stella", "fleet"],
        "root": "/repo",
        "pid": os.getpid(),
        **fields,
    }
    ledger.runs.create(run_id=run_id, **values)
    return run_id


class StepClock:
    """A settable epoch-ms clock for the ledger, so recorded times are whatever the builder says; with
    tick_ms each reading also moves it on (distinct, increasing times without setting it)."""

    def __init__(self, start_ms: int, *, tick_ms: int = 0) -> None:
        self.ms = start_ms
        self.tick_ms = tick_ms

    def __call__(self) -> int:
        self.ms += self.tick_ms
        return self.ms

    def advance(self, seconds: float) -> int:
        self.ms += int(seconds * 1000)
        return self.ms


BASE_COMMIT = "3f2a9c1e5b7d4f60a1b2c3d4e5f60718293a4b5c"
HOUR_MS = 3_600_000


def build_sample_ledger(
    path: Path, *, start_ms: int | None = None, live_pid: int | None = None
) -> dict[str, str]:
    """Three runs: a finished success with an isolated branch and CI, a failure with a skip, and (when
    live_pid is given) a run in progress owned by that pid, started now.

    Returns the run ids by role: {"ok", "failed", "running"}.
    """
    clock = StepClock(wall_ms() - 4 * HOUR_MS if start_ms is None else start_ms)
    ids: dict[str, str] = {}
    with Ledger.open(path, now_ms=clock) as ledger:
        ids["ok"] = _finished_run(ledger, clock)
        clock.advance(2 * HOUR_MS / 1000)
        ids["failed"] = _failed_run(ledger, clock)
        if live_pid is not None:
            clock.ms = max(clock.ms + 1000, wall_ms())  # a live fleet started just now, by a live process
            ids["running"] = _running_run(ledger, clock, live_pid)
    return ids


def _run_id(clock: StepClock, suffix: str) -> str:
    """A run id in the fleet's format (r-YYYYMMDD-HHMMSS-xxxx, UTC) for the clock's time."""
    return "r-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(clock.ms / 1000)) + f"-{suffix}"


_DOCS_BRANCH = "fleet/docs-5c1d7e9a0b2f4a6c"
_DOCS_WORKTREE = ".stella/worktrees/docs-5c1d7e9a0b2f4a6c"

# (task id, seconds it took, dollars, summary) of the finished run's three succeeded tasks, in order.
_FINISHED_WORK = (
    ("schema", 42.0, 0.41, "Added migration 0007 creating receipts with an execution_id foreign key."),
    ("reader", 65.0, 0.87, "Store::receipts_for_execution reads receipts ordered by created_at."),
    ("docs", 80.0, 1.12, "Rewrote docs/receipts.md twice; kept the task-oriented structure."),
)


def _finished_run(ledger: Ledger, clock: StepClock) -> str:
    run_id = _run_id(clock, "1a2b")
    add_run(
        ledger,
        run_id,
        plan_path="feature-buildout.toml",
        plan_sha256="ab" * 32,
        base_commit=BASE_COMMIT,
        max_concurrency=3,
        spend_limit_usd=6.0,
        pipeline="plain",
        argv=["stella", "--spend-limit", "6", "fleet", "--plan", "feature-buildout.toml"],
        root="/home/dev/shop",
        pid=4100,
    )
    ledger.tasks.add(run_id, _finished_tasks(), {"schema": 1, "reader": 2, "docs": 3})
    for n, (task_id, seconds, usd, summary) in enumerate(_FINISHED_WORK):
        _succeeded_task(ledger, clock, run_id, n, task_id, seconds=seconds, usd=usd, summary=summary)
    ledger.ci.upsert(
        run_id=run_id,
        branch=_DOCS_BRANCH,
        task_id="docs",
        head_sha="3" * 40,
        pr_url="https://github.com/example/shop/pull/412",
        pr_number=412,
        state=CIState.GREEN,
        conclusion="success",
        reason=None,
        run_urls=["https://github.com/example/shop/actions/runs/1"],
    )
    clock.advance(2)
    ledger.runs.finish(run_id, RunStatus.SUCCEEDED, exit_code=0)
    return run_id


def _finished_tasks() -> list[PlanTask]:
    return [
        PlanTask(
            "schema",
            "Add a migration creating the receipts table",
            "Add the migration",
            claims=("src/store/schema.rs",),
        ),
        PlanTask(
            "reader", "Add Store::receipts_for_execution", "Read path", ("schema",), ("src/store/read.rs",)
        ),
        PlanTask(
            "docs",
            "Rewrite docs/receipts.md against the new table",
            "Rewrite the receipts page",
            ("reader",),
            isolation="isolated",
        ),
    ]


def _succeeded_task(
    ledger: Ledger,
    clock: StepClock,
    run_id: str,
    n: int,
    task_id: str,
    *,
    seconds: float,
    usd: float,
    summary: str,
) -> None:
    """The n-th task of the finished run: one attempt that spends, commits and succeeds."""
    branch = worktree = None
    if task_id == "docs":
        branch, worktree = _DOCS_BRANCH, _DOCS_WORKTREE
        ledger.tasks.set_workspace(run_id, task_id, branch, worktree)
    ledger.tasks.set_status(run_id, task_id, TaskStatus.RUNNING)
    attempt = ledger.attempts.start(run_id, task_id, pipeline="plain", branch=branch, worktree=worktree)
    ledger.attempts.set_pid(attempt, 4200 + n)
    ledger.spend.add(
        attempt, usd, input_tokens=int(usd * 90_000), output_tokens=int(usd * 6_000), steps=9 + n
    )
    clock.advance(seconds)
    ledger.commits.record(
        [(f"{n + 1:x}" * 40, summary.split(";")[0].rstrip("."), clock.ms)],
        run_id=run_id,
        task_id=task_id,
        attempt_id=attempt,
        branch=branch or "main",
    )
    ledger.attempts.finish(
        attempt,
        AttemptEnd(outcome=AttemptOutcome.SUCCEEDED, exit_code=0, summary=summary, cpu_seconds=seconds / 3),
    )
    ledger.tasks.set_status(run_id, task_id, TaskStatus.SUCCEEDED)


def _failed_run(ledger: Ledger, clock: StepClock) -> str:
    run_id = _run_id(clock, "7c4e")
    add_run(
        ledger,
        run_id,
        base_commit=BASE_COMMIT,
        max_concurrency=2,
        pipeline="plain",
        argv=["fleet", "Fix the lint warnings"],
        root="/home/dev/shop",
        pid=5100,
    )
    tasks = [
        PlanTask("writer", "Record one receipt row per model call", "Write path"),
        PlanTask("report", "Summarise receipts per day", "Daily report", ("writer",)),
        PlanTask("lint", "Fix the lint warnings in store/", "Fix lint warnings"),
    ]
    ledger.tasks.add(run_id, tasks, {"writer": 1, "lint": 1, "report": 2})
    writer = ledger.attempts.start(run_id, "writer", pipeline="plain")
    lint = ledger.attempts.start(run_id, "lint", pipeline="plain")
    ledger.spend.add(writer, 0.35, input_tokens=30_000, output_tokens=2_000, steps=6)
    ledger.spend.add(lint, 0.12, input_tokens=11_000, output_tokens=900, steps=3)
    clock.advance(31)
    ledger.attempts.finish(
        writer,
        AttemptEnd(
            outcome=AttemptOutcome.FAILED,
            exit_code=1,
            summary="Could not find the engine's emit path.",
            error="tests failed: test_emit_records_receipt (AssertionError: 0 != 1)",
        ),
    )
    ledger.tasks.set_status(run_id, "writer", TaskStatus.FAILED, "tests failed")
    leave_for_you(ledger, run_id, "writer", "tests failed", attempt=writer)
    ledger.attempts.finish(
        lint, AttemptEnd(outcome=AttemptOutcome.SUCCEEDED, exit_code=0, summary="Fixed 7 warnings in store/.")
    )
    ledger.tasks.set_status(run_id, "lint", TaskStatus.SUCCEEDED)
    ledger.tasks.set_status(run_id, "report", TaskStatus.SKIPPED, "dependency failed: writer")
    clock.advance(1)
    ledger.runs.finish(run_id, RunStatus.FAILED, exit_code=1, reason="1 task failed, 1 skipped")
    return run_id


def _running_run(ledger: Ledger, clock: StepClock, pid: int) -> str:
    run_id = _run_id(clock, "9f3a")
    add_run(
        ledger,
        run_id,
        plan_path="release-prep.toml",
        plan_sha256="cd" * 32,
        base_commit=BASE_COMMIT,
        max_concurrency=2,
        spend_limit_usd=5.0,
        argv=["fleet", "--plan", "release-prep.toml"],
        root="/home/dev/shop",
        pid=pid,
    )
    tasks = [
        PlanTask("bump", "Bump the workspace version to 1.4.0", "Bump the version and changelog"),
        PlanTask("notes", "Update the release notes for 1.4.0", "Update the release notes page", ("bump",)),
    ]
    ledger.tasks.add(run_id, tasks, {"bump": 1, "notes": 2})
    ledger.tasks.set_status(run_id, "bump", TaskStatus.RUNNING)
    attempt = ledger.attempts.start(run_id, "bump", pipeline="command")
    ledger.attempts.set_pid(attempt, pid)
    ledger.spend.add(attempt, 0.05, input_tokens=4_000, output_tokens=300, steps=1)
    return run_id
