"""`stella watch [RUN]`: push a past run's branches again, follow their CI, exit 4 unless all end green."""

from __future__ import annotations

import argparse
from pathlib import Path

from stellafleet.ci.watch import watch_run
from stellafleet.commands import config_file_arg, positive_int
from stellafleet.core import jsontext
from stellafleet.core.config import load_config
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops
from stellafleet.state.ledger import Ledger


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="watch a run's branches through CI again (pushes, opens or updates PRs; exit 4 if any ends red)",
        description=(
            "Push every branch of RUN that holds successful work, open or update its pull request with gh "
            "(not for the default branch), and follow its CI to the end, keeping the PR's status current. "
            "Exit 0 when every watched branch ends green, 4 when one ends red, stalls or never shows CI, "
            "2 when gh is missing or not logged in or there is no remote to push to. Settings: [watch] in "
            ".stella/config.toml (poll_interval, appear_timeout, stall_timeout, total_timeout, remote, "
            "force_push, repo)."
        ),
    )
    parser.add_argument("run_ref", nargs="?", metavar="RUN", help="run id or unique prefix (default: latest)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document with each branch's outcome"
    )
    parser.add_argument(
        "--fix-ci",
        type=positive_int,
        metavar="N",
        help="a branch that ends red gets up to N follow-up attempts of its task, fed the CI failure",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    db = StatePaths(root).fleet_db
    if not db.exists():
        raise StellaError(f"no fleet has run in {root} yet: nothing to watch", exit_code=EXIT_USAGE)
    config = load_config(root, config_file=config_file_arg(args))
    with Ledger.open(db, readonly=True) as ledger:
        run_id = ledger.runs.resolve(args.run_ref)
    if args.fix_ci:
        from stellafleet.run.cifix import fixer_for_past_run

        with fixer_for_past_run(
            root,
            run_id,
            config,
            max_rounds=args.fix_ci,
            spend_limit=getattr(args, "spend_limit", None),
            config_file=config_file_arg(args),
        ) as fixer:
            result = watch_run(root, run_id, config=config, json_mode=args.json, fixer=fixer)
    else:
        result = watch_run(root, run_id, config=config, json_mode=args.json)
    if args.json:
        print(jsontext.dumps(result.to_json(), indent=2))
    return result.exit_code
