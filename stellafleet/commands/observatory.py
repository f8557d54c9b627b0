"""`stella observatory` (being built)."""

from __future__ import annotations

import argparse

from stellafleet.errors import StellaError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("observatory", help="(not built yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise StellaError("stella observatory is not built yet")
