"""`stella demo [DIR] [--keep]`: a real fleet, offline, in a scratch repository (simulated workers)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the offline demo fleet in a scratch repository",
        description=(
            "Create a scratch git repository (in DIR, or a temporary directory) and run a real fleet in it: "
            "three waves, shared-tree commits through the commit lane, an isolated worktree on a fleet/* "
            "branch, and a designed claim conflict. The workers' edits are simulated by a small script "
            "(the command pipeline): no network, no API key. Exit 0 when the demo behaved as designed."
        ),
    )
    parser.add_argument(
        "demo_dir", nargs="?", metavar="DIR", help="where to create the repository (new or empty)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary repository afterwards")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stellafleet.demo.tour import run_demo

    return run_demo(Path(args.demo_dir) if args.demo_dir else None, keep=args.keep)
