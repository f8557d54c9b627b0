"""`stella observatory`: serve the local web dashboard over the fleet ledger (read-only)."""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser
from pathlib import Path

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops
from stellafleet.observatory.server import DEFAULT_HOST, DEFAULT_PORT, is_loopback, make_server


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "observatory",
        help="serve the local web dashboard of fleet runs",
        description=(
            "Serve a local web dashboard whose Fleet runs card lists past and running fleets from the "
            "ledger (.stella/private/fleet.db, opened read-only). A running fleet updates live."
        ),
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"port to listen on; 0 picks a free one (default {DEFAULT_PORT})",
    )
    parser.add_argument("--open", action="store_true", help="open the dashboard in a web browser")
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    """A TCP port for --port (0: any free one); argparse turns the ValueError into a usage error."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, not {port}")
    return port


def run(args: argparse.Namespace) -> int:
    root = gitops.main_worktree_root(Path.cwd())
    ledger = StatePaths(root).fleet_db
    server = make_server(ledger, host=args.host, port=args.port)
    if not is_loopback(args.host):
        print(
            f"stella: warning: listening on {args.host}, which is not loopback: anyone who can reach this "
            "machine can read the fleet's prompts, summaries and paths (--host 127.0.0.1 keeps it local)",
            file=sys.stderr,
        )
    shown = ledger if ledger.exists() else f"{ledger} (not created yet; it appears when a fleet starts)"
    print(f"stella observatory: {server.url}  ledger: {shown}  (read-only; Ctrl-C stops)", flush=True)
    if args.open:
        threading.Thread(target=webbrowser.open, args=(server.url,), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        print("stella observatory: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
