"""`stella fleet`: run many workers at once against this repository."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from stellafleet.commands import positive_int
from stellafleet.core.errors import EXIT_PARKED, StellaError

if TYPE_CHECKING:
    from stellafleet.run.prepare import FleetOptions

DESCRIPTION = """\
Run a fleet: every prompt (or every task of --plan FILE) gets its own worker process. Tasks run in
dependency order, in waves of at most --max-concurrency; shared tasks work in the repository root under
file claims, isolated tasks in their own worktree on a fleet/<slug>-<hash> branch from the pinned base.
Ctrl-C once: launch nothing more and wait for running workers; twice: stop them.
The spend limit is global: stella --spend-limit USD fleet ...
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fleet",
        help="run a fleet of workers (inline prompts or --plan FILE)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "prompts", nargs="*", metavar="PROMPT", help="inline prompts; they become tasks t1, t2, ..."
    )
    parser.add_argument("--plan", metavar="FILE", help="a plan file (.toml, .json, .yaml, .yml)")
    parser.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="workers at once (default: the governor's number)",
    )
    parser.add_argument("--base-ref", metavar="REF", help="branch isolated tasks from REF (default: HEAD)")
    parser.add_argument(
        "--pipeline", metavar="VARIANT", help="pipeline for tasks that name none (default: plain, the engine)"
    )
    parser.add_argument("--watch", action="store_true", help="after the fan-out, follow each branch's CI")
    parser.add_argument(
        "--fix-ci",
        type=positive_int,
        metavar="N",
        help="with --watch: a branch that ends red gets up to N follow-up attempts fed its CI failure",
    )
    _add_land_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="show the waves and workspaces, run nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON result document instead")
    parser.add_argument(
        "--schedule",
        choices=("waves", "eager"),
        help="waves: a wave starts when the previous one has finished (default); eager: a task starts as "
        "soon as its dependencies succeeded and a worker slot is free",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN",
        help="run again what an earlier run (latest, an id or a prefix) left undone; its succeeded tasks "
        "count as done",
    )
    parser.add_argument("--force", action="store_true", help="with --resume: resume even if the plan changed")
    parser.add_argument(
        "--from-salvage",
        action="store_true",
        help="with --resume: each resumed isolated task starts from the work its last attempt left "
        "uncommitted (its latest salvage commit) instead of the base",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        help="where isolated tasks run: this machine (local) or a Ray cluster (default: [executor] kind)",
    )
    parser.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to use (HOST:PORT)")
    _start_options(parser)
    parser.set_defaults(func=run)


def _start_options(parser: argparse.ArgumentParser) -> None:
    """Provider limits, money before it is spent, and what the start may find in the shared tree."""
    parser.add_argument(
        "--wait-for-limits",
        action="store_true",
        help="on a provider's usage limit, wait for its reset (up to [fleet] max_limit_wait) and go on, "
        "instead of skipping the tasks not yet started (exit 3, --resume continues)",
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="run nothing: estimate each task's spend and duration and the run's total and wall time from "
        "the ledger's history (with --spend-limit: whether and where the limit likely stops it)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="start although files the tasks claim have uncommitted changes of yours (the workers' commits "
        "leave your changes out)",
    )
    parser.add_argument(
        "--allow-detached",
        action="store_true",
        help="let shared tasks commit onto a detached HEAD (default: refused; [fleet] allow_detached)",
    )


def _add_land_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--land",
        action="store_true",
        help="then land the run's branches with the merge train (`stella merge`, after --watch when given): "
        "exit 0 only when every task's work landed",
    )
    parser.add_argument(
        "--fix",
        type=int,
        metavar="N",
        help="with --land: an evicted branch goes back to its task's worker up to N times "
        "(default: [merge] fix_rounds)",
    )


def options_from(args: argparse.Namespace) -> FleetOptions:
    """The run the command line asks for, typed once (nothing past here sees argparse)."""
    from stellafleet.run.prepare import FleetOptions

    if args.fix_ci and not args.watch:
        raise StellaError("--fix-ci needs --watch: it acts on branches whose CI ends red")
    if args.fix is not None and not args.land:
        raise StellaError("--fix needs --land: it acts on branches the merge train evicted")
    # the options the command line and FleetOptions call by the same name
    options = {field.name: getattr(args, field.name) for field in fields(FleetOptions) if field.name in args}
    options.update(prompts=tuple(args.prompts), fix_ci=args.fix_ci or 0)
    return FleetOptions(
        **options,
        plan_path=args.plan,
        json_mode=args.json,
        config_file=args.config,
        argv=("stella", *sys.argv[1:]),
    )


def run(args: argparse.Namespace) -> int:
    from stellafleet.git import gitops
    from stellafleet.run.control import run_fleet
    from stellafleet.run.parked import say_parked

    options = options_from(args)
    code = run_fleet(options)
    if code == EXIT_PARKED:
        say_parked(gitops.main_worktree_root(options.cwd or Path.cwd()), code)
    if not args.land or args.dry_run:
        return code
    from stellafleet.commands import merge

    # the merge train on the run just made: watched branches after --watch, else every succeeded one
    landing = argparse.Namespace(
        run_ref=None, dry_run=False, unwatched=not args.watch, strategy=None, check=None, via_gh=False,
        resolve=False, json=False, serial=False, fix=args.fix, spend_limit=args.spend_limit,
        config=args.config, land=True, quiet=args.json,
    )  # fmt: skip
    landed = merge.run(landing)
    return code or landed
