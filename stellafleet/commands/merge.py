"""`stella merge [RUN]`: land a run's green fleet/* branches on the current branch, each checked first."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from stellafleet.commands import config_file_arg
from stellafleet.core import jsontext
from stellafleet.core.config import load_config
from stellafleet.core.errors import StellaError
from stellafleet.core.status import MergeStatus
from stellafleet.core.terminal import printable, single_line
from stellafleet.git import gitops
from stellafleet.merge.queue import MergeItem
from stellafleet.merge.runner import STRATEGIES, MergeOptions, MergeResult, merge_run
from stellafleet.merge.viagh import GH_STRATEGIES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="land a run's green fleet/* branches on the current branch, in dependency order",
        description=(
            "Take RUN's fleet/* branches whose CI ended green (all succeeded ones with --unwatched), in "
            "dependency order, rebase (or merge) each onto the current branch in a scratch worktree, run "
            "the [merge] check command there, and move the current branch forward only when it passes. "
            "A conflict or a failing check stops that branch (and those that depend on it); the others "
            "go on. Nothing is pushed. Refuses a work tree with uncommitted changes (exit 2). Exit 0 when "
            "every queued branch landed or was already in, 1 when one conflicted or failed its check."
        ),
    )
    parser.add_argument("run_ref", nargs="?", metavar="RUN", help="run id, unique prefix or latest (default)")
    parser.add_argument("--dry-run", action="store_true", help="show the order and what would happen")
    parser.add_argument(
        "--unwatched", action="store_true", help="take every succeeded branch, whatever CI said (or not)"
    )
    parser.add_argument(
        "--strategy",
        choices=sorted({*STRATEGIES, *GH_STRATEGIES}),
        help="rebase or merge (default: [merge] strategy); with --via-gh also squash",
    )
    parser.add_argument(
        "--via-gh",
        action="store_true",
        help="ask GitHub to merge each green branch's pull request (gh pr merge; a merge queue is "
        "honoured) in dependency order, instead of merging locally",
    )
    parser.add_argument("--check", metavar="CMD", help="the check command (default: [merge] check)")
    parser.add_argument(
        "--resolve",
        action="store_true",
        help="hand a conflicting branch to a worker as a task whose prompt carries the conflict "
        "(under the spend limit); its result is checked like any other",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document with each branch's step")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    config = load_config(root, config_file=config_file_arg(args))
    settings = config.merge
    options = MergeOptions(
        run_ref=args.run_ref,
        dry_run=args.dry_run,
        unwatched=args.unwatched,
        strategy=args.strategy or settings.strategy,
        check=args.check if args.check is not None else settings.check,
        check_timeout=settings.check_timeout,
        check_tail_lines=settings.check_tail_lines,
        worktree=config.worktree,
        init_submodules=config.fleet.init_submodules,
    )
    progress = None if args.json else print_item
    if args.via_gh:
        from stellafleet.merge.viagh import merge_via_gh

        if args.resolve:
            raise StellaError(
                "--resolve resolves conflicts locally; it does not go with --via-gh", exit_code=2
            )
        result = merge_via_gh(root, options, config.watch, progress=progress)
    else:
        make_resolver = None
        if args.resolve:
            from stellafleet.merge.resolve import Resolver

            # called with (ledger, run_id)
            make_resolver = partial(
                Resolver, root, config=config, spend_limit=args.spend_limit, config_file=config_file_arg(args)
            )

        result = merge_run(root, options, progress=progress, make_resolver=make_resolver)
    if args.json:
        print(jsontext.dumps(result.to_json(), indent=2))
    else:
        print_summary(result)
    return result.exit_code


MARK = {
    MergeStatus.PLANNED: "would land",
    MergeStatus.MERGED: "merged",
    MergeStatus.CONFLICT: "CONFLICT",
    MergeStatus.CHECK_FAILED: "CHECK FAILED",
    MergeStatus.SKIPPED: "skipped",
    MergeStatus.ERROR: "ERROR",
}


def print_item(item: MergeItem) -> None:
    after = f" (after {', '.join(item.after)})" if item.after else ""
    mark = "would clash" if item.reason.startswith("would conflict") else MARK[item.status]
    said = single_line(f"{item.branch} [{item.task_id}]{after}: {item.reason}")
    print(f"{item.position:>2}. {mark:<12} {said}")
    if item.status == MergeStatus.CHECK_FAILED and item.check_tail:
        for said in item.check_tail.splitlines():  # the check's own output: shown, never obeyed
            print(f"      | {printable(said)}")
    sys.stdout.flush()


def print_summary(result: MergeResult) -> None:
    if result.refusal is not None:
        print(f"the real merge will refuse (exit 2): {single_line(result.refusal)}")
    for item in result.left_out:
        print(f"    {'left out':<12} {single_line(f'{item.branch} [{item.task_id}]: {item.reason}')}")
    if not result.queue:
        print(f"Nothing to merge from run {result.run_id}: no succeeded fleet/* branch is ready.")
        return
    if result.options.dry_run:
        count = f"{len(result.queue)} branch(es) of run {result.run_id}"
        print(f"dry run: {count} onto {result.onto}; nothing changed")
        return
    if result.onto == "GitHub":  # --via-gh: GitHub merged them; nothing moved here
        failed = result.count(MergeStatus.ERROR)
        print(f"run {result.run_id}: GitHub merged {result.count(MergeStatus.MERGED)}, failed {failed}, "
              f"skipped {result.count(MergeStatus.SKIPPED)} (nothing merged locally)")  # fmt: skip
        return
    moved = (
        f"{result.onto} moved {result.start_sha[:12]} -> {result.end_sha[:12]}"
        if result.end_sha != result.start_sha
        else f"{result.onto} unchanged"
    )
    failed = result.count(MergeStatus.CONFLICT) + result.count(MergeStatus.CHECK_FAILED)
    print(
        f"run {result.run_id}: merged {result.count(MergeStatus.MERGED)}, failed {failed}, "
        f"skipped {result.count(MergeStatus.SKIPPED)}; {moved} (nothing pushed)"
    )
    if result.open_prs:
        from stellafleet.ci.openprs import open_pull_requests_note

        print(open_pull_requests_note(result.open_prs, result.onto))
