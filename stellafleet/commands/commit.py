"""`stella commit -m MSG PATH ...`: commit exactly these paths, for a worker's task or the user."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from stellafleet.core.errors import EXIT_OK

if TYPE_CHECKING:
    from stellafleet.core.workercontext import WorkerContext
    from stellafleet.git.keptree import KeptTree


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "commit",
        help="commit exactly these paths through the commit lane (a worker's, or your own)",
        description=(
            "Commit exactly the named paths (deleted ones as deletions) for this worker's task. In the "
            "shared tree the commit goes through the workspace-wide commit lane, so it never sweeps in "
            "another worker's files or the user's own changes; it is recorded in the fleet ledger. "
            "Outside a worker it is your own commit: through the lane, the hooks run on exactly these "
            "paths, recorded for no task."
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


def commit_tree(ctx: WorkerContext) -> KeptTree | None:
    """The repository's commit tree, readied as every new tree is, when a shared commit's hooks run there
    (`[commit] hooks_in`, docs/claims.md#the-commit-tree); None: they run in the shared tree."""
    from stellafleet.core.config import load_config
    from stellafleet.git import committree
    from stellafleet.git.keptree import KeptTree
    from stellafleet.run import bootstrap, checking

    config = load_config(ctx.root)
    if (
        not ctx.shared
        or ctx.commit_hooks != "run"
        or config.commit.hooks_in != committree.HOOKS_IN_COMMIT_TREE
    ):
        return None
    ready = functools.partial(
        bootstrap.ready,
        config=config.worktree,
        env=checking.check_env(os.environ),
        log_path=committree.log_path(ctx.root),
        root=ctx.root,
        init_submodules=config.fleet.init_submodules,
    )
    return KeptTree(
        ctx.root, committree.tree_path(ctx.root), ready=ready, setup_inputs=config.worktree.setup_inputs or ()
    )


def _note_refusal(ctx: WorkerContext, reason: str | None) -> None:
    """A worker's refused commit, as the attempt fact its attempt fails with (run/steps/commitrefusal.py)."""
    if not ctx.run_id:
        return
    from stellafleet.git.hooks import REFUSED_FACT
    from stellafleet.state.ledger import Ledger

    with Ledger.open(ctx.paths.fleet_db) as ledger:
        if reason is not None or REFUSED_FACT in ledger.facts.of_attempt(ctx.attempt_id):
            ledger.facts.set(ctx.attempt_id, REFUSED_FACT, reason)


def run(args: argparse.Namespace) -> int:
    from stellafleet.core.workercontext import WorkerContext
    from stellafleet.git.hooks import HookFailed
    from stellafleet.git.lane import commit_paths, users_context
    from stellafleet.state import journal
    from stellafleet.state.proof import prove_attempt

    cwd = Path(os.path.realpath(os.getcwd()))
    if "STELLA_RUN_ID" in os.environ:
        ctx = WorkerContext.from_env()
        prove_attempt(ctx)  # a copied or made-up worker environment: refused, exit 2
    else:  # the user's own commit
        ctx = users_context(cwd)
    paths = [workspace_relative(ctx.workspace, given, cwd) for given in args.paths]
    with journal.acting(ctx.root, "commit"):  # killed, its lane and scratch are repaired by the next command
        try:
            sha = commit_paths(ctx, paths, args.message, commit_tree=commit_tree(ctx))
        except HookFailed as refused:
            _note_refusal(ctx, refused.reason)
            raise
        _note_refusal(ctx, None)  # a later commit that went through: the refusal is no reason any more
    print(sha)
    return EXIT_OK
