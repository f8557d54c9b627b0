"""`stella answer ITEM --allow|--deny|TEXT`: a person's answer to a parked task (commands/inbox.py)."""

from __future__ import annotations

import argparse

from stellafleet.core.errors import EXIT_USAGE, StellaError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "answer",
        help="answer a parked task: --allow or --deny its tool request, or TEXT for its question",
        description=(
            "Record your answer to ITEM (from `stella inbox`): --allow lets the task use the tool (that one "
            "request, for the rest of the task), --deny refuses it, TEXT answers its question. The task goes "
            "on in its own session with the answer: at once while its fleet still waits for answers "
            "([fleet] park_wait), otherwise with `stella fleet --resume RUN`."
        ),
    )
    parser.add_argument("item", type=int, metavar="ITEM", help="the item's number in `stella inbox`")
    parser.add_argument("text", nargs="?", metavar="TEXT", help="the answer to its question")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--allow", action="store_true", help="allow the tool request")
    choice.add_argument("--deny", action="store_true", help="deny the tool request (TEXT: why)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stellafleet.commands.inbox import print_answer

    if args.allow and args.text:
        raise StellaError("--allow takes no text: `stella answer ITEM --allow`", exit_code=EXIT_USAGE)
    if not (args.allow or args.deny or (args.text or "").strip()):
        raise StellaError(
            'say what you answer: `stella answer ITEM --allow`, `--deny`, or `stella answer ITEM "text"`',
            exit_code=EXIT_USAGE,
        )
    kind = "allow" if args.allow else "deny" if args.deny else "text"
    return print_answer(args.item, kind, (args.text or "").strip())
