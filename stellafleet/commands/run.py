"""`stella run PROMPT`: one engine worker in this tree, recorded in the ledger as a one-task run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from stellafleet.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE, StellaError

if TYPE_CHECKING:
    from stellafleet.core.config import Config
    from stellafleet.pipelines.plain import PlainPipeline
    from stellafleet.plan.model import PlanTask

DESCRIPTION = """\
Run the built-in engine once, on one prompt, in this repository (the shared tree), without a fleet.
It follows the [engine] config, commits through the commit lane, and lands in the ledger as a run with
one task. With the global --spend-limit USD, the worker's guard is the whole limit.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="one engine worker in this tree (the engine without the fleet)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("prompt", metavar="PROMPT", help="what the worker should do")
    parser.add_argument("--model", help="use this model instead of engine.model")
    parser.add_argument("--json", action="store_true", help="print one JSON result document instead")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stellafleet.core.config import load_config
    from stellafleet.pipelines.plain import PlainPipeline
    from stellafleet.plan.model import plan_from_prompts
    from stellafleet.run.prepare import check_environment

    root = check_environment(Path.cwd())
    task = plan_from_prompts([args.prompt]).tasks[0]
    config = load_config(root, config_file=Path(args.config) if args.config else None)
    pipeline = PlainPipeline()
    problem = pipeline.preflight(config, spend_limited=args.spend_limit is not None, model=args.model)
    if problem:
        raise StellaError(problem, exit_code=EXIT_USAGE)
    return _run_task(root, task, config, pipeline, args)


def _run_task(
    root: Path, task: PlanTask, config: Config, pipeline: PlainPipeline, args: argparse.Namespace
) -> int:
    from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths
    from stellafleet.core.workercontext import WorkerContext
    from stellafleet.engine.progress import ProgressPrinter
    from stellafleet.git import gitops
    from stellafleet.pipelines.base import PipelineResult
    from stellafleet.run.prepare import new_run_id
    from stellafleet.state.claims import ClaimStore
    from stellafleet.state.ledger import Ledger
    from stellafleet.worker.main import LedgerSpend

    gitops.ensure_excluded(root, list(EXCLUDED_DIRS))
    paths = StatePaths(root)
    run_id = new_run_id()
    base_commit = gitops.head_commit(root)
    branch = gitops.current_branch(root)
    log_path = paths.log_file(run_id, task.id)
    transcript_path = paths.transcript_file(run_id, task.id)
    argv = ["stella", "run", *(["--model", args.model] if args.model else []), args.prompt]
    with Ledger.open(paths.fleet_db) as ledger:
        ledger.create_run(
            run_id=run_id,
            plan_path=None,
            plan_sha256=None,
            base_ref="HEAD",
            base_commit=base_commit,
            max_concurrency=1,
            spend_limit_usd=args.spend_limit,
            pipeline=pipeline.name,
            argv=argv,
            root=str(root),
            pid=os.getpid(),
        )
        ledger.add_tasks(run_id, [task], {task.id: 1})
        attempt_id = ledger.start_attempt(
            run_id,
            task.id,
            pipeline=pipeline.name,
            branch=branch,
            log_path=str(log_path),
            transcript_path=str(transcript_path),
        )
        ledger.set_attempt_pid(attempt_id, os.getpid())
        ledger.set_task_status(run_id, task.id, "running")
    ctx = WorkerContext(
        root=root,
        workspace=root,
        run_id=run_id,
        task_id=task.id,
        task_title=task.title,
        attempt_id=attempt_id,
        prompt=task.prompt,
        isolation="shared",
        branch=branch,
        base_commit=base_commit,
        spend_guard_usd=args.spend_limit,
        pipeline=pipeline.name,
        model=args.model,
        timeout_s=None,
        result_path=paths.result_file(run_id, task.id, attempt_id),
        log_path=log_path,
        transcript_path=transcript_path,
    )
    from stellafleet.run.reporter import LossyStream

    # a reader that goes away (`| head -1`, a hung-up terminal) must not fail the run or leave it running
    out = cast(TextIO, LossyStream(sys.stdout))
    quiet = args.quiet or args.json
    if not quiet:
        guard = f", spend guard ${args.spend_limit:.2f}" if args.spend_limit is not None else ""
        print(f"stella run {run_id}: task {task.id} ({task.title}){guard}", file=out, flush=True)
    spend = LedgerSpend(ctx)
    outcome, status, reason = "failed", "failed", None
    result: PipelineResult | None = None
    error: BaseException | None = None
    with ExitStack() as stack:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = stack.enter_context(log_path.open("a", encoding="utf-8"))
        progress = ProgressPrinter([log] if quiet else [out, log])
        try:
            stack.enter_context(_hangup_interrupts())
            result = pipeline.run(ctx, config, spend, events=progress)
            outcome = status = "succeeded" if result.success else "failed"
            if progress.stop == "spend_guard":
                status, reason = "spend_limited", "the spend guard stopped the worker"
        except KeyboardInterrupt as exc:
            outcome = status = "interrupted"
            result, error = PipelineResult(False, "interrupted", error="interrupted"), exc
        except Exception as exc:
            text = str(exc) if isinstance(exc, StellaError) else f"{type(exc).__name__}: {exc}"
            result, error = PipelineResult(False, f"worker error: {text}", error=text), exc
        finally:
            spend.close()
            with ClaimStore.open(paths.store_db) as store:
                store.release_attempt(run_id, attempt_id)
        log.write(f"{outcome}: {result.summary}\n")
    exit_code = EXIT_OK if result.success else EXIT_TASK_FAILED
    if isinstance(error, StellaError):
        exit_code = error.exit_code
    elif isinstance(error, KeyboardInterrupt):
        exit_code = EXIT_INTERRUPTED
    with Ledger.open(paths.fleet_db) as ledger:
        ledger.finish_attempt(
            attempt_id, outcome=outcome, exit_code=exit_code, summary=result.summary, error=result.error
        )
        why = None if result.success else result.error or (result.summary.splitlines() or [""])[0] or None
        ledger.set_task_status(run_id, task.id, outcome, why)
        ledger.finish_run(run_id, status, exit_code=exit_code, reason=reason or why)
        spent = ledger.run_spend(run_id)
    if error is not None:
        raise error
    if args.json:
        document = {"run_id": run_id, "task_id": task.id, "attempt_id": attempt_id, **result.to_json()}
        document["spend_usd"] = spent
        print(json.dumps(document, indent=2), file=out)
        return exit_code
    print(
        f"{outcome} in {result.steps} steps, ${spent:.4f}, "
        f"{result.input_tokens:,} input / {result.output_tokens:,} output tokens (run {run_id})",
        file=out,
    )
    print("summary:", file=out)
    for line in result.summary.splitlines() or [""]:
        print(f"  {line}", file=out)
    return exit_code


@contextmanager
def _hangup_interrupts() -> Iterator[None]:
    """SIGHUP (the terminal closed) and SIGTERM end the run like Ctrl-C: recorded `interrupted`, not killed
    on the spot with the run left `running` in the ledger."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    stops = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {signum: signal.signal(signum, interrupt) for signum in stops}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
