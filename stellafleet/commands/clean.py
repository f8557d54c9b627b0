"""`stella clean`: remove the worktrees and fleet/* branches finished runs left behind, safely."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from stellafleet.commands import config_file_arg
from stellafleet.core import jsontext
from stellafleet.core.config import load_config
from stellafleet.core.errors import StellaError
from stellafleet.git import gitops
from stellafleet.git.clean import KEPT, REMOVED, WOULD_REMOVE, CleanReport, clean
from stellafleet.state import journal


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "clean",
        help="remove the worktrees and fleet/* branches of finished runs",
        description=(
            "Remove the worktrees (under .stella/worktrees/) and fleet/* branches that the ledger "
            "recorded for finished runs' tasks. Never touches a live attempt's, even with --force. "
            "Without --force it keeps (and names) worktrees with uncommitted changes (ignored files do not "
            "count, as for git) unless a salvage ref holds them, and branches with commits no other branch "
            "and no salvage ref holds. Each deleted branch's tip is printed (was SHA). `[worktree] teardown` "
            "runs before a worktree goes. Your own branches are never candidates."
        ),
    )
    parser.add_argument(
        "--run", dest="run_ref", metavar="RUN", help="only this run (id, unique prefix, or latest)"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed; change nothing")
    parser.add_argument(
        "--force",
        action="store_true",
        help="also remove dirty worktrees and unmerged branches (never a live attempt's)",
    )
    parser.add_argument(
        "--salvage",
        action="store_true",
        help="also remove the runs' salvage refs (refs/stella/salvage/...: unfinished attempts' uncommitted "
        "work); nothing else ever removes them",
    )
    parser.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="with --salvage: only salvage refs older than DAYS days",
    )
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    if args.older_than is not None and not args.salvage:
        raise StellaError("--older-than goes with --salvage: stella clean --salvage --older-than DAYS")
    if args.older_than is not None and args.older_than < 0:
        raise StellaError(f"--older-than must be 0 or more days, not {args.older_than:g}")
    worktree = load_config(root, config_file=config_file_arg(args)).worktree
    with journal.acting(root, "clean") if not args.dry_run else contextlib.nullcontext():
        report = clean(
            root,
            run_ref=args.run_ref,
            dry_run=args.dry_run,
            force=args.force,
            worktree=worktree,
            salvage_refs=args.salvage,
            older_than_days=args.older_than,
        )
    if args.json:
        print(jsontext.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
        print_open_pull_requests(root, report)
    return 0


def print_open_pull_requests(root: Path, report: CleanReport) -> None:
    """The pull requests --watch opened for the branches removed here: GitHub still has them open."""
    gone = {REMOVED, WOULD_REMOVE}
    removed = [(i.run_id, i.target) for i in report.items if i.kind == "branch" and i.action in gone]
    if not removed:
        return
    from stellafleet.ci.openprs import open_pull_requests, open_pull_requests_note
    from stellafleet.core.paths import StatePaths
    from stellafleet.state.ledger import Ledger

    prs: dict[str, int] = {}
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        for run_id in dict.fromkeys(run for run, _ in removed):
            branches = [branch for run, branch in removed if run == run_id]
            prs.update(open_pull_requests(ledger.get_run(run_id), branches))
    if prs:
        print(open_pull_requests_note(prs, gitops.current_branch(root) or "your branch"))


def print_report(report: CleanReport) -> None:
    if not report.items:
        what = "the fleet ledger records no worktree or fleet/* branch that is still there"
        print(f"Nothing to clean: {what}.")
        return
    verb = {REMOVED: "removed", WOULD_REMOVE: "would remove", KEPT: "kept"}
    for item in report.items:
        owner = f"run {item.run_id}" + (f", task {item.task_id}" if item.task_id else "")
        print(f"{verb[item.action]:<12} {item.kind:<8} {item.target}  ({owner}): {item.reason}")
    gone = report.with_action(WOULD_REMOVE if report.dry_run else REMOVED)
    kept = report.with_action(KEPT)
    summary = f"{'would remove' if report.dry_run else 'removed'} {len(gone)}, kept {len(kept)}"
    if report.dry_run:
        summary += " (dry run: nothing was changed)"
    elif kept and not report.force and any("--force" in item.reason for item in kept):
        summary += "; --force also removes unmerged branches and dirty worktrees (never a live attempt's)"
    print(summary)
