"""`stella inbox`: what waits on a person, across runs, oldest first, each with the command that answers it;
`stella answer ITEM --allow|--deny|TEXT` (commands/answer.py) records the answer."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stellafleet.core import jsontext
from stellafleet.core.errors import EXIT_OK, EXIT_USAGE, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import FollowUpReason, RequestState
from stellafleet.core.terminal import single_line
from stellafleet.git import gitops
from stellafleet.run.steps.park import answer_command as parked_answer
from stellafleet.run.steps.park import parked_of
from stellafleet.state.ledger import Ledger


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inbox",
        help="what waits on you (parked tasks' questions and tool requests, red checks, ...), oldest first",
        description=(
            "Every request that waits on a person, across the repository's runs, oldest first: a parked "
            "task's question or tool request (answer it with `stella answer ITEM`), a red check or CI with "
            "no round left, a failed task (`stella fleet --resume RUN`)."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(func=run)


def open_ledger(*, readonly: bool) -> Ledger:
    root = gitops.main_worktree_root(Path.cwd())
    db = StatePaths(root).fleet_db
    if not db.exists():
        raise StellaError(f"no fleet has run in {root} yet: nothing waits on you", exit_code=EXIT_USAGE)
    return Ledger.open(db, readonly=readonly)


def answer_command(row: Mapping[str, Any], parked: Mapping[str, Any]) -> str:
    """The command that answers a waiting request (or goes on with its task)."""
    if row.get("reason") != FollowUpReason.ANSWER:
        return f"stella fleet --resume {row['run_id']}"
    return parked_answer(row["id"], parked)


def items(ledger: Ledger) -> list[dict[str, Any]]:
    found = []
    for row in ledger.requests.waiting():
        parked = parked_of(ledger, row)
        found.append(
            {
                "item": row["id"],
                "run_id": row["run_id"],
                "task_id": row["task_id"],
                "branch": row["branch"],
                "reason": row["reason"],
                "asked_at_ms": row["asked_at_ms"],
                "what": row["context"],
                "parked": parked or None,
                "answer": answer_command(row, parked),
            }
        )
    return found


def run(args: argparse.Namespace) -> int:
    with open_ledger(readonly=True) as ledger:
        found = items(ledger)
    if args.json:
        print(jsontext.dumps({"items": found}))
        return EXIT_OK
    if not found:
        print("nothing waits on you")
        return EXIT_OK
    for item in found:
        where = f"run {item['run_id']} task {item['task_id'] or item['branch'] or '-'}"
        print(f"{item['item']:>4}  {where}  ({item['reason']})")
        print(f"      {single_line(item['what'])[:300]}")
        print(f"      {item['answer']}")
    return EXIT_OK


def refusal(row: Mapping[str, Any] | None, item: int) -> str | None:
    """Why an item cannot be answered now (None: it waits on a person)."""
    if row is None:
        return f"no item {item}: `stella inbox` lists what waits on you"
    state = row["state"]
    if row.get("answered_by"):  # answered (and perhaps served since)
        return f"item {item} was already answered by {row['answered_by']}: one answer is kept"
    if state == RequestState.NEEDS_YOU and row["reason"] != FollowUpReason.ANSWER:
        go_on = f"stella fleet --resume {row['run_id']}"
        return f"item {item} is not a question or a tool request: go on with `{go_on}`"
    if state != RequestState.NEEDS_YOU:
        why = f" ({row['why']})" if row.get("why") else ""
        return f"item {item} is no longer waiting: it is {state}{why}"
    return None


def answer_item(item: int, kind: str, text: str) -> str:
    """Record a person's answer to item; the line that says so. StellaError (exit 2) for what cannot be
    answered: an unknown item, one no longer waiting, a second answer, the wrong kind of answer."""
    with open_ledger(readonly=False) as ledger:
        row = ledger.requests.get(item)
        problem = refusal(row, item)
        if problem is None and row is not None:
            question = parked_of(ledger, row).get("kind") == "question"
            if question and kind != "text":
                problem = f'item {item} asks a question: answer it with text (stella answer {item} "...")'
            elif not question and kind == "text":
                problem = f"item {item} asks to use a tool: answer it with --allow or --deny"
        if problem is not None:
            raise StellaError(problem, exit_code=EXIT_USAGE)
        if not ledger.requests.answer(item, kind, text, by=getpass.getuser()):
            row = ledger.requests.get(item)  # answered or taken by another process meanwhile
            raise StellaError(refusal(row, item) or f"item {item} changed meanwhile", exit_code=EXIT_USAGE)
        assert row is not None
        run_id = row["run_id"]
    said = {"allow": "allowed", "deny": "denied", "text": "answered"}[kind]
    return (
        f"item {item} {said}: task {row['task_id']} goes on in its session as soon as its fleet sees it "
        f"(or with `stella fleet --resume {run_id}`)"
    )


def print_answer(item: int, kind: str, text: str) -> int:
    print(answer_item(item, kind, text), file=sys.stdout)
    return EXIT_OK
