"""`stella restore`: the files failed or stopped shared tasks left in your work tree put back to HEAD."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stellafleet.core import jsontext
from stellafleet.core.paths import StatePaths
from stellafleet.core.terminal import printable
from stellafleet.git import gitops
from stellafleet.git.salvage import leftovers, leftovers_said, put_back
from stellafleet.run.steps.claims import covered
from stellafleet.state.claims import ClaimStore


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "restore",
        help="put back to HEAD the files failed or stopped shared tasks left in your work tree",
        description=(
            "A shared task whose attempt failed, was stopped or was killed leaves its edits in your work "
            "tree; they were salvaged (refs/stella/salvage/...). Put each such file back as HEAD has it, in "
            "the "
            "index and the work tree, when it still holds exactly what was salvaged; a file with anything "
            "else in it (your own changes) is never touched. The salvage refs stay (stella clean --salvage "
            "removes them); `stella fleet --resume RUN` still starts from them."
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="name the files; change nothing")
    parser.add_argument("--json", action="store_true", help="print the files and their salvage refs as JSON")
    parser.set_defaults(func=run)


def held_by_live_workers(root: Path) -> dict[str, str]:
    """Claimed path -> its live holder's description: a running task's files are never put back (a task
    resumed from its leftovers holds exactly what was salvaged)."""
    db = StatePaths(root).store_db
    if not db.exists():
        return {}
    with ClaimStore.open(db) as store:
        return {path: holder.describe() for path, holder in store.claims() if holder.is_alive()}


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    found = leftovers(root, gitops.changed_paths(root))
    held = held_by_live_workers(root) if found else {}
    for path in sorted(found):
        holder = next((who for claim, who in held.items() if covered(path, [claim])), None)
        if holder is not None:
            del found[path]
            print(
                f"stella restore: kept {printable(path)}: claimed by running {printable(holder)}",
                file=sys.stderr,
            )
    if found and not args.dry_run:
        put_back(root, sorted(found))
    if args.json:
        files = [{"path": path, "salvage_ref": ref.ref} for path, ref in sorted(found.items())]
        print(jsontext.dumps({"dry_run": args.dry_run, "restored": files}, indent=2))
    elif not found:
        print("no failed task's leftovers in the work tree: nothing to restore")
    else:
        done = "would put back" if args.dry_run else "put back"
        print(f"{done} to HEAD: {printable(leftovers_said(found))}")
    return 0
