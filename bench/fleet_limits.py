"""Fleet-wide backoff against per-worker retries only, on one plan and one rate-limited provider.

The scripted model server answers the first `--limited` model calls across all workers 429 with
`Retry-After: --retry-after` seconds, and any call that comes back inside that window 429 too (a
provider's window). The same plan (`--tasks` engine tasks of `--reads` model calls each, eager, at most
`--concurrency` at once) runs twice in fresh repositories: with the fleet-wide backoff (the default:
workers report each limit, the fleet halves its width, holds new starts until the reset and every worker
waits out the latest reset before its next call) and with `[fleet] fleet_backoff = false` (each worker's
transport retries on its own, honouring Retry-After). Printed per mode: the model calls the server
received, how many it answered 429, tasks that did not succeed, the fleet's narrowest width, and the
wall time.

    python bench/fleet_limits.py [--tasks 8] [--concurrency 4] [--reads 3] [--limited 4] [--retry-after 2]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stellafleet.testing.model_server import RateLimit, ScriptedModelServer

STELLA = [sys.executable, "-m", "stellafleet"]
PRICED = '[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n'


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_repo(root: Path) -> None:
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    git("config", "user.name", "Bench", cwd=root)
    git("config", "user.email", "bench@example.invalid", cwd=root)
    (root / "README.md").write_text("# bench\n")
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "init", cwd=root)


def session(task: str, reads: int) -> list[dict[str, Any]]:
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]}
    steps = [{**read, "usage": {"input_tokens": 1000, "output_tokens": 20}} for _ in range(reads - 1)]
    finish = {"tool_calls": [{"name": "finish", "arguments": {"summary": f"{task} done"}}]}
    return [*steps, {**finish, "usage": {"input_tokens": 1100, "output_tokens": 10}}]


def run_mode(base: Path, args: argparse.Namespace, backoff: bool) -> dict[str, Any]:
    root = base / ("backoff" if backoff else "per-worker")
    make_repo(root)
    ids = [f"t{n:02d}" for n in range(args.tasks)]
    scripts = {f"marker-{i}:": session(i, args.reads) for i in ids}
    limit = RateLimit(calls=args.limited, retry_after=args.retry_after)
    plan = root / "plan.toml"
    plan.write_text(
        "".join(f'[[tasks]]\nid = "{i}"\nprompt = "marker-{i}: read the README"\n\n' for i in ids)
    )
    with ScriptedModelServer([], scripts=scripts, rate_limit=limit) as server:
        (root / ".stella").mkdir()
        (root / ".stella/config.toml").write_text(
            f'[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n'
            f"max_retries = 10\n{PRICED}\n[fleet]\nfleet_backoff = {'true' if backoff else 'false'}\n"
        )
        started = time.monotonic()
        proc = subprocess.run(
            [*STELLA, "-C", str(root), "--quiet", "fleet", "--plan", str(plan), "--schedule", "eager",
             "--max-concurrency", str(args.concurrency)],
            capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=900,
        )  # fmt: skip
        wall = time.monotonic() - started
        calls, limited = len(server.requests), server.rate_limited
    with sqlite3.connect(root / ".stella/private/fleet.db") as conn:
        not_ok = conn.execute("SELECT count(*) FROM tasks WHERE status != 'succeeded'").fetchone()[0]
        widths = [
            row[0] for row in conn.execute("SELECT concurrency FROM limit_events WHERE kind = 'concurrency'")
        ]
    return {
        "mode": "fleet-wide backoff" if backoff else "per-worker retries only",
        "calls": calls,
        "429s": limited,
        "not succeeded": not_ok,
        "narrowest width": min(widths, default=args.concurrency),
        "wall s": round(wall, 1),
        "exit": proc.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--reads", type=int, default=3, help="model calls per task")
    parser.add_argument("--limited", type=int, default=4, help="calls answered 429 before the window")
    parser.add_argument("--retry-after", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stella-bench-limits-") as tmp:
        rows = [run_mode(Path(tmp), args, backoff) for backoff in (True, False)]
    needed = args.tasks * args.reads
    limit = f"the first {args.limited} calls 429, Retry-After {args.retry_after:g}s"
    print(f"{args.tasks} tasks x {args.reads} model calls ({needed} answered calls needed), eager, "
          f"max concurrency {args.concurrency}; {limit}")  # fmt: skip
    keys = list(rows[0])
    print("  ".join(f"{key:>24}" if key == "mode" else f"{key:>15}" for key in keys))
    for row in rows:
        print("  ".join(f"{row[key]!s:>24}" if key == "mode" else f"{row[key]!s:>15}" for key in keys))
    saved = rows[1]["calls"] - rows[0]["calls"]
    print(f"model calls saved by the fleet-wide backoff: {saved} of {rows[1]['calls']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
