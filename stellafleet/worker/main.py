"""The worker process, `python -m stellafleet.worker.main`: one task, one pipeline, one result file.

It learns everything from its environment (WorkerContext), reports dollars as they are spent to the
ledger, and always leaves a result JSON behind unless it is killed. The fleet starts one of these per
task, in a session of its own; the pipeline's own processes (an agent CLI, the command pipeline's shell)
are its children.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from stellafleet import pipelines
from stellafleet.core import jsontext
from stellafleet.core.config import load_config
from stellafleet.core.errors import StellaError
from stellafleet.core.spend import SpendTally
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.proc.orphan import end_when_orphaned
from stellafleet.state.ledger import Ledger


class LedgerSpend(SpendTally):
    """The worker's tally: every report lands in the ledger for this attempt as it happens."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__()
        self._ctx = ctx
        self._ledger: Ledger | None = None

    def record(self, usd: float, input_tokens: int, output_tokens: int, steps: int) -> None:
        if self._ledger is None:
            self._ledger = Ledger.open(self._ctx.paths.fleet_db)
        self._ledger.spend.add(
            self._ctx.attempt_id, usd, input_tokens=input_tokens, output_tokens=output_tokens, steps=steps
        )

    def close(self) -> None:
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None


def run_task(ctx: WorkerContext, spend: LedgerSpend) -> PipelineResult:
    """Run ctx's pipeline; any exception becomes a failed result carrying its text."""
    try:
        result = pipelines.load(ctx.pipeline).run(ctx, load_config(ctx.root), spend)
    except Exception as exc:
        text = str(exc) if isinstance(exc, StellaError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, StellaError):
            traceback.print_exc()
        result = PipelineResult(success=False, summary=f"worker error: {text}", error=text)
    try:
        spend.settle(result)
    except Exception as exc:  # the ledger refusing is worth saying, not worth losing the result
        print(f"stella worker: could not record spend: {exc}", file=sys.stderr)
    return result


def write_result(path: Path, result: PipelineResult) -> None:
    """Write the result JSON atomically: the fleet sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)  # the fleet makes it; a worker run by hand may not
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(jsontext.dumps(result.to_json()))
    os.replace(tmp, path)


def main() -> int:
    try:
        ctx = WorkerContext.from_env()
    except StellaError as exc:
        print(f"stella worker: {exc}", file=sys.stderr)
        return 2
    if os.getpgrp() == os.getpid():  # a worker the fleet started (its own group): it dies with the fleet
        end_when_orphaned()
    print(
        f"stella worker: run {ctx.run_id} task {ctx.task_id} attempt {ctx.attempt_id} "
        f"pipeline {ctx.pipeline} in {ctx.workspace}",
        flush=True,
    )
    spend = LedgerSpend(ctx)
    try:
        result = run_task(ctx, spend)
    finally:
        spend.close()
    write_result(ctx.result_path, result)
    outcome = AttemptOutcome.SUCCEEDED if result.success else AttemptOutcome.FAILED
    print(f"stella worker: {outcome}: {result.summary}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
