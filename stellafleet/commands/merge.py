"""`stella merge [RUN]`: land a run's green fleet/* branches on the current branch, each checked first."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from stellafleet.commands import config_file_arg
from stellafleet.core import jsontext
from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import StellaError
from stellafleet.core.status import MergeStatus
from stellafleet.core.terminal import printable, single_line
from stellafleet.core.words import plural
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
            "dependency order, in batches of branches that change disjoint paths ([merge] window; "
            "--serial: one at a time): rebase (or merge) a batch onto the current branch in a scratch "
            "worktree, run the checks once on the result, and move the current branch forward only when "
            "they pass; a red batch is bisected. A conflicting or failing branch is evicted and goes back "
            "to its task (--fix N); the others go on. Nothing is pushed. Refuses a work tree with "
            "uncommitted changes (exit 2). Exit 0 when every queued branch landed or was already in, 1 when "
            "one conflicted or failed its check."
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
    parser.add_argument(
        "--serial",
        action="store_true",
        help="land one branch at a time (a train window of 1) instead of batches of disjoint branches",
    )
    parser.add_argument(
        "--fix",
        type=int,
        metavar="N",
        help="hand an evicted branch back to its task's worker up to N times, then try it again "
        "(default: [merge] fix_rounds); also serves the evictions an earlier merge left waiting",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document with each branch's step")
    parser.set_defaults(func=run)


def options_from(args: argparse.Namespace, config: Config) -> MergeOptions:
    """What the command line asks, over `[merge]` (--serial: a window of 1)."""
    settings = config.merge
    window = 1 if args.serial else settings.window
    return MergeOptions(
        run_ref=args.run_ref,
        dry_run=args.dry_run,
        unwatched=args.unwatched,
        strategy=args.strategy or settings.strategy,
        check=args.check if args.check is not None else settings.check,
        check_timeout=settings.check_timeout,
        check_tail_lines=settings.check_tail_lines,
        worktree=config.worktree,
        init_submodules=config.fleet.init_submodules,
        window=window,
        max_window=1 if args.serial else settings.max_window,
        parallel_checks=settings.parallel_checks,
        check_retries=settings.check_retries,
        retry_on=settings.retry_on or (),
        fix_rounds=args.fix if args.fix is not None else settings.fix_rounds,
    )


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    config = load_config(root, config_file=config_file_arg(args))
    options = options_from(args, config)
    quiet = getattr(args, "quiet", False)  # stella fleet --land --json: its own document is stdout
    progress = None if args.json or quiet else print_item
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

        make_fixer = None
        if options.fix_rounds:
            from stellafleet.merge.evicted import Fixer

            make_fixer = partial(
                Fixer, root, config=config, spend_limit=args.spend_limit, config_file=config_file_arg(args)
            )
        say = None if args.json or quiet else print_line
        result = merge_run(
            root, options, progress=progress, make_resolver=make_resolver, make_fixer=make_fixer, say=say
        )
    if args.json:
        print(jsontext.dumps(result.to_json(), indent=2))
    elif not quiet:
        print_summary(result)
    if getattr(args, "land", False):  # stella fleet --land: every task's work landed, or not
        print(land_summary(result), file=sys.stderr if quiet else sys.stdout)
        landed = all(item.status in (MergeStatus.MERGED, MergeStatus.SKIPPED) for item in result.queue)
        return result.exit_code or (0 if landed and not result.left_out else 1)
    return result.exit_code


def land_summary(result: MergeResult) -> str:
    """stella fleet --land's last word: what landed, what was evicted and why, what waits on you."""
    landed = [item.branch for item in result.queue if item.status == MergeStatus.MERGED]
    out = [item for item in result.queue if item.status not in (MergeStatus.MERGED, MergeStatus.SKIPPED)]
    lines = [f"land: {len(landed)} of {len(result.queue)} branch(es) landed on {result.onto}"]
    lines += [f"  evicted: {item.branch} [{item.task_id}]: {single_line(item.reason)}" for item in out]
    lines += [
        f"  not taken: {item.branch or item.task_id}: {single_line(item.reason)}" for item in result.left_out
    ]
    if out:
        lines.append(
            f"  waiting on you: {plural(len(out), 'eviction')} (`stella merge --fix N` hands them back to "
            "their tasks; `stella runs` shows each request)"
        )
    return "\n".join(lines)


MARK = {
    MergeStatus.PLANNED: "would land",
    MergeStatus.MERGED: "merged",
    MergeStatus.CONFLICT: "CONFLICT",
    MergeStatus.CHECK_FAILED: "CHECK FAILED",
    MergeStatus.SKIPPED: "skipped",
    MergeStatus.ERROR: "ERROR",
}


def print_line(line: str) -> None:
    print(f"    {printable(line)}", flush=True)


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
