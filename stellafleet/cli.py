"""The `stella` command line: argparse wiring; each command is a function returning an exit code."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from stellafleet import __version__
from stellafleet.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, DiskFull, StellaError, is_disk_full
from stellafleet.core.terminal import printable
from stellafleet.state.journal import recover_from

COMMAND_MODULES = (
    "fleet",
    "plan",
    "run",
    "runs",
    "watch",
    "merge",
    "clean",
    "leases",
    "restore",
    "observatory",
    "commit",
    "pipelines",
    "config",
    "demo",
    "inbox",
    "answer",
)

EXIT_CODES_HELP = """\
exit codes:
  0    everything asked succeeded
  1    a task failed or was skipped
  2    usage error, invalid plan or config, or wrong environment (nothing ran)
  3    the spend limit stopped the fleet before every task ran
  4    --watch: a watched branch ended red, stalled, or never showed CI
  5    parked: only tasks waiting on a person remain (stella inbox, stella answer)
  130  interrupted
"""

_GLOBAL_WITH_VALUE = {"--spend-limit", "--config", "-C"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise StellaError(f"{message} (see `{self.prog} --help`)", exit_code=EXIT_USAGE)


def _spend_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of dollars: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of dollars: {text!r}")
    return value


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stella",
        description="Run many AI coding-agent workers at once against one git repository.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stella {__version__}")
    parser.add_argument(
        "--spend-limit",
        type=_spend_limit,
        metavar="USD",
        help="cap the dollars the whole command may spend (env: STELLA_SPEND_LIMIT); goes before the command",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="use this config file instead of .stella/config.toml"
    )
    parser.add_argument("-C", dest="directory", metavar="DIR", help="run as if started in DIR")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="count", default=0, help="more output")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="less output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        if only is None or name == only:
            importlib.import_module(f"stellafleet.commands.{name}").add_parser(sub)
        else:
            # Workers call `stella commit` often: import only the command that runs.
            sub.add_parser(name)
    return parser


def _command_index(argv: Sequence[str]) -> int:
    """Where the command word stands in argv (len(argv) when there is none)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in _GLOBAL_WITH_VALUE:
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            break
    return min(i, len(argv))


def misplaced_spend_limit(argv: Sequence[str]) -> str | None:
    """The corrected command line when --spend-limit follows the subcommand, else None."""
    args = list(argv)
    command_at = _command_index(args)
    for j in range(command_at + 1, len(args)):
        token = args[j]
        if token == "--":
            return None
        if token == "--spend-limit" or token.startswith("--spend-limit="):
            taken = 2 if token == "--spend-limit" else 1  # `--spend-limit USD` or `--spend-limit=USD`
            moved = args[j : j + 2] if taken == 2 else ["--spend-limit", token.split("=", 1)[1]]
            rest = args[:j] + args[j + taken :]
            return shlex.join(["stella", *rest[:command_at], *moved, *rest[command_at:]])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    corrected = misplaced_spend_limit(argv)
    if corrected is not None:
        print(
            "stella: error: --spend-limit is a global option and goes before the command; run:\n"
            f"  {corrected}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args: argparse.Namespace | None = None
    try:
        at = _command_index(argv)
        word = argv[at] if at < len(argv) else None
        parser = build_parser(word if word in COMMAND_MODULES else None)
        args = parser.parse_args(argv)
        logging.basicConfig(
            level=logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING,
            format="stella: %(message)s",
        )
        if args.spend_limit is None and os.environ.get("STELLA_SPEND_LIMIT"):
            try:
                args.spend_limit = _spend_limit(os.environ["STELLA_SPEND_LIMIT"])
            except argparse.ArgumentTypeError as exc:
                raise StellaError(f"STELLA_SPEND_LIMIT: {exc}") from None
        if args.directory:
            try:
                os.chdir(args.directory)
            except OSError as exc:
                raise StellaError(f"-C {args.directory}: {exc.strerror}") from None
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        recover_from(Path.cwd())  # what a killed stella process left here, repaired first
        return int(args.func(args))
    except StellaError as exc:
        text = printable(str(exc))  # it can quote a file, a git message or a plan: shown, never obeyed
        print(f"stella: error: {text}" if "\n" not in text else text, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stella: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so in one line, details only when asked
        if is_disk_full(exc):  # ENOSPC from a write of ours: the user's to free, not a bug
            print(f"stella: error: {DiskFull(getattr(exc, 'filename', None) or Path.cwd())}", file=sys.stderr)
            return EXIT_USAGE
        if args is not None and args.verbose:
            traceback.print_exc()
        print(
            f"stella: internal error: {type(exc).__name__}: {exc} (a bug; rerun with -v for details)",
            file=sys.stderr,
        )
        return 1
