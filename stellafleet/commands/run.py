"""`stella run PROMPT`: one engine worker in this tree: a fleet of one task, shown as the engine's own run."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from stellafleet.core.errors import EXIT_USAGE, StellaError

if TYPE_CHECKING:
    from stellafleet.run.prepare import FleetOptions

PIPELINE = "plain"  # the built-in engine
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
    parser.add_argument(
        "--allow-detached",
        action="store_true",
        help="commit onto a detached HEAD (default: refused; [fleet] allow_detached)",
    )
    parser.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> FleetOptions:
    """`stella run` as a fleet: one shared task, the built-in engine, Ctrl-C stops it."""
    from stellafleet.run.prepare import FleetOptions

    return FleetOptions(
        prompts=(args.prompt,),
        max_concurrency=1,  # the worker's spend guard is the whole limit
        # no base_ref: the current branch is recorded as the base, as `stella fleet` records it
        pipeline=PIPELINE,
        model=args.model,
        json_mode=args.json,
        quiet=args.quiet,
        spend_limit=args.spend_limit,
        config_file=args.config,
        stop_on_first_interrupt=True,
        allow_detached=getattr(args, "allow_detached", False),
        argv=("stella", "run", *(("--model", args.model) if args.model else ()), args.prompt),
    )


def run(args: argparse.Namespace) -> int:
    from stellafleet.run.control import run_fleet
    from stellafleet.run.onetask import OneTaskReporter
    from stellafleet.run.prepare import NotReady

    reporter = OneTaskReporter(json_mode=args.json, quiet=args.quiet)
    try:
        return run_fleet(options_from(args), reporter=reporter)
    except NotReady as exc:  # the engine's own problem, said as such: there is no fleet to start here
        problems = [problem.removeprefix(f"pipeline {PIPELINE}: ") for problem in exc.problems]
        raise StellaError("; ".join(problems), exit_code=EXIT_USAGE) from None
