"""One module per `stella` command, each exposing add_parser(subparsers); argument types they share."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stellafleet.core.errors import EXIT_OK, EXIT_USAGE


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def usage(parser: argparse.ArgumentParser) -> int:
    """A command group given no subcommand: its help on stderr, exit 2."""
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def print_schema(text: str) -> int:
    """`stella config schema`, `stella plan schema`: a bundled JSON Schema's text, as shipped."""
    sys.stdout.write(text)
    return EXIT_OK


def config_file_arg(args: argparse.Namespace) -> Path | None:
    return Path(args.config) if getattr(args, "config", None) else None


def repository_or_none() -> Path | None:
    from stellafleet.core.errors import StellaError
    from stellafleet.git import gitops

    try:
        return gitops.repo_root(Path.cwd())
    except StellaError:
        return None
