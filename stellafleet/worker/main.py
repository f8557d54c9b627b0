"""The worker process, `python -m stellafleet.worker.main`: one task, one pipeline, one result file.
Told everything by its environment; spend reaches the ledger as it happens; a result file unless killed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from stellafleet import pipelines
from stellafleet.core import jsontext
from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import StellaError
from stellafleet.core.limits import LimitEvent, LimitReporter
from stellafleet.core.spend import SpendTally
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.proc.subreaper import become_subreaper, end_descendants, end_when_orphaned, on_sigterm
from stellafleet.state.ledger import Ledger


class LedgerSpend(SpendTally):
    """The worker's tally: every report lands in the ledger for this attempt as it happens; its limits
    too, unless `[fleet] fleet_backoff = false` leaves each worker to retry on its own."""

    def __init__(self, ctx: WorkerContext, *, fleet_backoff: bool = True) -> None:
        super().__init__()
        self.ctx = ctx
        self._ledger: Ledger | None = None
        self.limits: LimitReporter | None = self if fleet_backoff else None

    def limit(self, event: LimitEvent) -> None:
        """A limit met lands in the ledger, where the fleet reads it."""
        ctx = self.ctx
        print(f"stella worker: {event.kind} limit from {event.source} ({event.reset_text()})", flush=True)
        self.ledger().limits.add(ctx.run_id, event, attempt_id=ctx.attempt_id, task_id=ctx.task_id)

    def hold_s(self) -> float:
        """The fleet-wide hold: the latest rate-limit reset any worker of the run wrote."""
        reset = self.ledger().limits.latest_rate_reset_ms(self.ctx.run_id)
        return 0.0 if reset is None else max(0.0, reset / 1000 - time.time())

    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger.open(self.ctx.paths.fleet_db)
        return self._ledger

    def record(
        self, usd: float, input_tokens: int, output_tokens: int, steps: int, cached: tuple[int, int] = (0, 0)
    ) -> None:
        self.ledger().spend.add(
            self.ctx.attempt_id,
            usd,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            steps=steps,
            cache_read_tokens=cached[0],
            cache_write_tokens=cached[1],
        )

    def close(self) -> None:
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None


def run_task(ctx: WorkerContext, spend: LedgerSpend, config: Config | None = None) -> PipelineResult:
    """Run ctx's pipeline; any exception becomes a failed result carrying its text."""
    try:
        result = pipelines.load(ctx.pipeline).run(ctx, config or load_config(ctx.root), spend)
    except Exception as exc:
        text = str(exc) if isinstance(exc, StellaError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, StellaError):
            import traceback

            traceback.print_exc()
        result = PipelineResult(success=False, summary=f"worker error: {text}", error=text)
    try:
        spend.settle(result)
    except Exception as exc:  # the ledger refusing is worth saying, not worth losing the result
        print(f"stella worker: could not record spend: {exc}", file=sys.stderr)
    return result


def commit_leftovers(ctx: WorkerContext, result: PipelineResult) -> PipelineResult:
    """A succeeded isolated task's uncommitted changes, committed for it; a failed commit fails the task."""
    from stellafleet.git import gitops  # the lane: only when needed
    from stellafleet.git.lane import commit_paths

    try:
        paths = gitops.changed_paths(ctx.workspace)
        if paths:
            message = f"{ctx.task_title or ctx.task_id} ({ctx.pipeline}, uncommitted changes)"
            sha = commit_paths(ctx, paths, message)
            result.summary = f"{result.summary}; committed what it left uncommitted in {sha[:12]}"
    except StellaError as exc:
        result.success = False
        result.summary = f"{result.summary}; its uncommitted changes could not be committed: {exc}"
        result.error = result.summary
    return result


def write_result(path: Path, result: PipelineResult) -> None:
    """Write the result JSON atomically: the fleet sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)  # the fleet makes it; a worker run by hand may not
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(jsontext.dumps(result.to_json()))
    os.replace(tmp, path)


def _end_with_descendants(signum: int) -> None:
    """A stopped worker (the fleet's SIGTERM) takes everything below it along, then ends as signalled."""
    end_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def main() -> int:
    try:
        ctx = WorkerContext.from_env()
    except StellaError as exc:
        print(f"stella worker: {exc}", file=sys.stderr)
        return 2
    if os.getpgrp() == os.getpid():  # a worker the fleet started (its own group): it dies with the fleet
        end_when_orphaned()
    if become_subreaper():  # what the task starts stays below this process, even if it double-forks
        on_sigterm(_end_with_descendants)
    print(
        f"stella worker: run {ctx.run_id} task {ctx.task_id} attempt {ctx.attempt_id} "
        f"pipeline {ctx.pipeline} in {ctx.workspace}",
        flush=True,
    )
    try:
        config: Config | None = load_config(ctx.root)
    except StellaError:  # a config the pipeline will refuse is run_task's to report
        config = None
    spend = LedgerSpend(ctx, fleet_backoff=config.fleet.fleet_backoff if config else True)
    try:
        result = run_task(ctx, spend, config)
    finally:
        spend.close()
    left = end_descendants()  # nothing outlives its attempt: the result is written once they are gone
    if left:
        print(f"stella worker: ended {left} process(es) the task left running", flush=True)
    if result.success and not ctx.shared:  # once nothing else writes its worktree (a shared task's: never)
        result = commit_leftovers(ctx, result)
    write_result(ctx.result_path, result)
    outcome = AttemptOutcome.SUCCEEDED if result.success else AttemptOutcome.FAILED
    print(f"stella worker: {outcome}: {result.summary}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
