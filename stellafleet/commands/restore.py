"""`stella restore`: the files failed or stopped shared tasks left in your work tree put back to HEAD."""

from __future__ import annotations

import argparse
from pathlib import Path

from stellafleet.core import jsontext
from stellafleet.core.terminal import printable
from stellafleet.git import gitops
from stellafleet.git.salvage import leftovers, leftovers_said, put_back


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


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    found = leftovers(root, gitops.changed_paths(root))
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
