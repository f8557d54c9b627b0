"""The simulated worker of `stella demo`: writes what an agent would, then commits it with `stella commit`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.command import RESULT_ENV
from stellafleet.proc import runner
from stellafleet.state.ledger import Ledger

FILES: dict[str, dict[str, str]] = {
    "schema": {
        "src/store/schema.rs": "pub struct Receipt { pub execution_id: i64 }\n",
        "src/store/migrations.rs": 'pub const CREATE: &str = "CREATE TABLE receipts";\n',
    },
    "changelog": {"CHANGELOG.md": "# Changelog\n\n- receipts table\n"},
    "release-notes": {"CHANGELOG.md": "# Changelog\n\nRelease notes: receipts\n"},
    "reader": {"src/store/read.rs": "pub fn receipts_for_execution() {}\n"},
    "writer": {"src/store/write.rs": "pub fn record_receipt() {}\n"},
    "docs": {"docs/receipts.md": "# Receipts\n\nOne row per model call, keyed by execution.\n"},
}

# The two tasks of the designed claim conflict: the one that runs holds its claim until the other failed.
CONFLICTING = ("changelog", "release-notes")
CONFLICT_WAIT_S = 60.0
POLL_S = 0.05
THINKING_S = 0.4  # long enough to see the workers side by side


def another_attempt_failed(ctx: WorkerContext) -> bool:
    """True once an attempt of this run has been recorded as failed (the designed conflict)."""
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        attempts = ledger.get_run(ctx.run_id)["attempts"]
    return any(attempt["outcome"] == AttemptOutcome.FAILED for attempt in attempts)


def wait_for_the_conflict(ctx: WorkerContext) -> None:
    """Hold the shared claim until the other claimant has been turned away (or the wait runs out)."""
    deadline = time.monotonic() + CONFLICT_WAIT_S
    while not another_attempt_failed(ctx) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def run_task(ctx: WorkerContext, result_file: str) -> int:
    """Edit, commit and report the task; the exit status is the task's."""
    files = FILES[ctx.task_id]
    if ctx.task_id in CONFLICTING:
        wait_for_the_conflict(ctx)
    time.sleep(THINKING_S)
    for rel, text in files.items():
        (ctx.workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx.workspace / rel).write_text(text)
    title = ctx.task_title or ctx.task_id
    done = runner.run([sys.executable, "-m", "stellafleet", "commit", "-m", title, *files], session=False)
    print(done.stdout.strip() or done.stderr.strip())
    if done.returncode:
        return done.returncode
    summary = f"(simulated) {title.lower()}: committed {done.stdout.strip()[:12]}"
    Path(result_file).write_text(json.dumps({"summary": summary, "steps": 1}))
    print(summary)
    return 0


def main() -> int:
    """The task of the fleet worker this process runs under; outside one, a one-line refusal."""
    try:
        ctx = WorkerContext.from_env()
        result_file = os.environ.get(RESULT_ENV)
        if not result_file:
            raise StellaError(f"{RESULT_ENV} is not set: run it through the command pipeline")
        return run_task(ctx, result_file)
    except StellaError as exc:
        print(f"stella demo worker: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
