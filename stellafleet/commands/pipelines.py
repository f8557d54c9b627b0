"""`stella pipelines` (being built)."""

from __future__ import annotations

import argparse

from stellafleet.errors import StellaError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("pipelines", help="(not built yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise StellaError("stella pipelines is not built yet")
