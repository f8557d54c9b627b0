"""`stella leases`: the named locks and ports held on this machine, by whom (every repository's fleets)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stellafleet.commands.runs import fmt_time
from stellafleet.core import jsontext
from stellafleet.core.errors import EXIT_OK
from stellafleet.core.terminal import aligned
from stellafleet.state.leases import LeaseStore, store_path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "leases",
        help="the named locks and leased ports held on this machine, and by whom",
        description=(
            "List the named locks (a plan's `locks`) and the ports (`[resources] ports`) every stella on "
            "this machine holds, who holds them and who waits; what a process that died held is freed first."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(func=run)


def _who(row: dict[str, Any]) -> str:
    return f"task {row['task_id']} of run {row['run_id']} in {row['repo']} (pid {row['pid']})"


def run(args: argparse.Namespace) -> int:
    store = LeaseStore.if_any()
    if store is None:
        held: dict[str, list[dict[str, Any]]] = {"locks": [], "waiting": [], "ports": []}
    else:
        with store:
            store.reclaim()
            held = store.held()
    for row in held["waiting"]:
        row["names"] = json.loads(row.pop("names_json"))
    if args.json:
        print(jsontext.dumps({"store": str(store_path()), **held}, indent=2))
        return EXIT_OK
    rows = [("lease", "held by", "since")]
    rows += [(f"lock {row['name']}", _who(row), fmt_time(row["at_ms"])) for row in held["locks"]]
    rows += [
        (f"waits for {', '.join(row['names'])}", _who(row), fmt_time(row["since_ms"]))
        for row in held["waiting"]
    ]
    rows += [
        (f"port {row['port']}", _who(row) + (f", worktree {row['worktree']}" if row["worktree"] else ""),
         fmt_time(row["at_ms"]))
        for row in held["ports"]
    ]  # fmt: skip
    if len(rows) == 1:
        print(f"no locks or ports held on this machine ({store_path()})")
        return EXIT_OK
    for line in aligned(rows):
        print(line)
    return EXIT_OK
