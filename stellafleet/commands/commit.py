"""`stella commit -m MSG PATH ...`: inside a worker, commit exactly these paths for its task."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stellafleet.core.errors import EXIT_OK


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "commit",
        help="inside a fleet worker: commit exactly these paths through the commit lane",
        description=(
            "Commit exactly the named paths (deleted ones as deletions) for this worker's task. In the "
            "shared tree the commit goes through the workspace-wide commit lane, so it never sweeps in "
            "another worker's files or the user's own changes; it is recorded in the fleet ledger. "
            "Works only inside a process started by `stella fleet`."
        ),
    )
    parser.add_argument("-m", "--message", required=True, metavar="MSG", help="the commit message")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files to commit")
    parser.set_defaults(func=run)


def workspace_relative(workspace: Path, given: str, cwd: Path) -> str:
    """A path given relative to cwd, spelled relative to the workspace (absolute paths pass through)."""
    if os.path.isabs(given):
        return given
    full = os.path.normpath(os.path.join(cwd, given))
    return os.path.relpath(full, os.path.realpath(workspace))


def run(args: argparse.Namespace) -> int:
    from stellafleet.core.workercontext import WorkerContext
    from stellafleet.git.lane import commit_paths
    from stellafleet.state import journal
    from stellafleet.state.proof import prove_attempt

    ctx = WorkerContext.from_env()  # outside a worker: a clear StellaError, exit 2
    prove_attempt(ctx)  # a copied or made-up worker environment: refused, exit 2
    cwd = Path(os.path.realpath(os.getcwd()))
    paths = [workspace_relative(ctx.workspace, given, cwd) for given in args.paths]
    with journal.acting(ctx.root, "commit"):  # killed, its lane and scratch are repaired by the next command
        sha = commit_paths(ctx, paths, args.message)
    print(sha)
    return EXIT_OK
