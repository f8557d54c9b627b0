"""`stella demo`: a real fleet, offline, in a scratch repository.

The workers' edits are simulated by a small script run through the `command` pipeline (no model, no
network, no key). Everything else is the real thing: worker processes, file claims, the commit lane,
an isolated worktree on a fleet/* branch, the ledger. One failure is designed in: two tasks of the first
wave claim the same file, so the second to dispatch fails naming the first.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from stellafleet.core.errors import EXIT_OK, EXIT_TASK_FAILED, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops

PLAN_NAME = "fleet-demo.toml"
WORKER_SCRIPT = ".stella/demo/worker.py"

LEDGER_QUERY = """\
SELECT a.task_id, a.branch, a.summary
  FROM attempts a
 WHERE a.run_id = (SELECT id FROM runs ORDER BY created_at_ms DESC LIMIT 1)
   AND a.success = 0;"""

PLAN = """\
# The demo plan: three waves, shared tasks under claims, one isolated task, one designed conflict.
[defaults]
pipeline = "command"

[[tasks]]
id = "schema"
title = "Add the migration"
prompt = "Add a migration creating the receipts table"
claims = ["src/store/schema.rs", "src/store/migrations.rs"]

[[tasks]]
id = "changelog"
title = "Note the receipts table in the changelog"
prompt = "Add a changelog entry for the receipts table"
claims = ["CHANGELOG.md"]

[[tasks]]
id = "release-notes"
title = "Draft the release notes"
prompt = "Draft release notes in CHANGELOG.md"
claims = ["CHANGELOG.md"]

[[tasks]]
id = "reader"
title = "Read path"
prompt = "Add Store::receipts_for_execution reading the receipts table"
depends_on = ["schema"]
claims = ["src/store/read.rs"]

[[tasks]]
id = "writer"
title = "Write path"
prompt = "Record one receipt row per model call"
depends_on = ["schema"]
claims = ["src/store/write.rs"]

[[tasks]]
id = "docs"
title = "Rewrite the receipts page"
prompt = "Rewrite docs/receipts.md against the new table"
depends_on = ["reader", "writer"]
isolation = "isolated"
"""

# The simulated worker: it edits files as an agent would, then commits them with `stella commit`.
WORKER = '''\
"""Simulated worker for `stella demo`: writes what an agent would write, then commits it."""
import json, os, sqlite3, subprocess, sys, time
from pathlib import Path

TASK = os.environ["STELLA_TASK_ID"]
WS = Path(os.environ["STELLA_WORKSPACE"])
RUN = os.environ["STELLA_RUN_ID"]
FILES = {
    "schema": {"src/store/schema.rs": "pub struct Receipt { pub execution_id: i64 }\\n",
               "src/store/migrations.rs": "pub const CREATE: &str = \\"CREATE TABLE receipts\\";\\n"},
    "changelog": {"CHANGELOG.md": "# Changelog\\n\\n- receipts table\\n"},
    "release-notes": {"CHANGELOG.md": "# Changelog\\n\\nRelease notes: receipts\\n"},
    "reader": {"src/store/read.rs": "pub fn receipts_for_execution() {}\\n"},
    "writer": {"src/store/write.rs": "pub fn record_receipt() {}\\n"},
    "docs": {"docs/receipts.md": "# Receipts\\n\\nOne row per model call, keyed by execution.\\n"},
}


def others_failed():
    """True once another attempt of this run has been recorded as failed (the designed conflict)."""
    db = Path(os.environ["STELLA_ROOT"]) / ".stella" / "private" / "fleet.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        query = "SELECT count(*) FROM attempts WHERE run_id = ? AND outcome = 'failed'"
        return conn.execute(query, (RUN,)).fetchone()[0] > 0
    finally:
        conn.close()


if TASK in ("changelog", "release-notes"):
    deadline = time.monotonic() + 60  # hold CHANGELOG.md until the other claimant has been turned away
    while not others_failed() and time.monotonic() < deadline:
        time.sleep(0.05)
time.sleep(0.4)  # "thinking": long enough to see the workers side by side
for rel, text in FILES[TASK].items():
    path = WS / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
title = os.environ.get("STELLA_TASK_TITLE") or TASK
done = subprocess.run([sys.executable, "-m", "stellafleet", "commit", "-m", title, *FILES[TASK]],
                      capture_output=True, text=True)
print(done.stdout.strip() or done.stderr.strip())
if done.returncode:
    sys.exit(done.returncode)
summary = f"(simulated) {title.lower()}: committed {done.stdout.strip()[:12]}"
Path(os.environ["STELLA_COMMAND_RESULT"]).write_text(json.dumps({"summary": summary, "steps": 1}))
print(summary)
'''

SCAFFOLD = {
    "README.md": "# demo store\n\nA scratch repository made by `stella demo`.\n",
    "src/store/mod.rs": "pub mod schema;\n",
    "docs/receipts.md": "# Receipts\n\nTo be written.\n",
}


def _say(out: IO[str], text: str = "") -> None:
    print(text, file=out, flush=True)


def create_repository(root: Path) -> None:
    """A fresh repository with a small project, the demo plan, the config and the simulated worker."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise StellaError(f"{root} is not empty: give `stella demo` a new or empty directory")
    gitops.git("init", "-q", cwd=root)
    gitops.git("symbolic-ref", "HEAD", "refs/heads/main", cwd=root)
    gitops.git("config", "user.name", "stella demo", cwd=root)
    gitops.git("config", "user.email", "demo@stellafleet.invalid", cwd=root)
    gitops.git("config", "commit.gpgsign", "false", cwd=root)
    files = {
        **SCAFFOLD,
        PLAN_NAME: PLAN,
        WORKER_SCRIPT: WORKER,
        ".stella/config.toml": (
            "# stella demo: every task runs the simulated worker through the command pipeline\n"
            f"[pipelines.command]\nrun = {_toml(shlex.join([sys.executable, WORKER_SCRIPT]))}\n"
        ),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    gitops.git("add", "--", *files, cwd=root)
    gitops.git("commit", "-q", "-m", "demo project", cwd=root)


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_fleet_process(root: Path) -> int:
    """The fleet, exactly as a user runs it (its output goes straight to the terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}
    argv = [sys.executable, "-m", "stellafleet", "fleet", "--plan", PLAN_NAME, "--max-concurrency", "4"]
    return subprocess.call(argv, cwd=root, env=env, stdin=subprocess.DEVNULL)


def ledger_failures(root: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{StatePaths(root).fleet_db}?mode=ro", uri=True)
    try:
        return conn.execute(LEDGER_QUERY).fetchall()
    finally:
        conn.close()


def check_outcome(root: Path) -> list[str]:
    """What differed from the design (empty: the demo behaved as designed)."""
    from stellafleet.state.ledger import Ledger

    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(ledger.resolve_run_id(None))
    status = {task["id"]: task for task in record["tasks"]}
    problems = []
    for task_id in ("schema", "reader", "writer", "docs"):
        if status[task_id]["status"] != "succeeded":
            problems.append(f"{task_id} ended {status[task_id]['status']}: {status[task_id]['reason']}")
    pair = [status["changelog"], status["release-notes"]]
    failed = [t for t in pair if t["status"] == "failed"]
    if len(failed) != 1 or not (failed[0]["reason"] or "").startswith(
        "claim conflict: CHANGELOG.md is held by"
    ):
        problems.append("expected exactly one of changelog / release-notes to fail with a claim conflict")
    docs_branch = status["docs"]["branch"] or ""
    if not docs_branch.startswith("fleet/docs-"):
        problems.append("docs did not run on a fleet/docs-<hash> branch")
    branches = {commit["branch"] for commit in record["commits"]}
    if docs_branch not in branches or "main" not in branches:
        problems.append("expected commits both on main (shared tasks) and on the docs branch")
    return problems


def run_demo(directory: Path | None, *, keep: bool, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    scratch = directory is None
    root = (
        Path(tempfile.mkdtemp(prefix="stella-demo-")) / "repo" if directory is None else directory.resolve()
    )
    try:
        create_repository(root)
        _say(out, f"stella demo: a scratch repository at {root}")
        _say(
            out, "  The workers' edits are SIMULATED by a small script (the `command` pipeline) instead of a"
        )
        _say(out, "  model: no network, no API key. Everything else is real: worker processes, file claims,")
        _say(out, "  the commit lane, an isolated worktree on a fleet/* branch, and the ledger.")
        _say(out, "  One failure is part of the demo: changelog and release-notes both claim CHANGELOG.md in")
        _say(out, "  wave 1, so the second to dispatch fails naming the first, and the fleet exits 1.")
        _say(out)
        _say(out, f"$ stella fleet --plan {PLAN_NAME} --max-concurrency 4")
        code = run_fleet_process(root)
        _say(out, f"(the fleet exited {code})")
        _say(out)
        _say(out, "$ git log --oneline main")
        _say(out, gitops.git("log", "--oneline", "main", cwd=root).rstrip())
        _say(out, "$ git branch --list 'fleet/*'")
        _say(out, gitops.git("branch", "--list", "fleet/*", cwd=root).rstrip())
        _say(out)
        _say(out, "Which tasks failed in the most recent run, and what the worker said:")
        _say(out, f'$ sqlite3 .stella/private/fleet.db "{" ".join(LEDGER_QUERY.split())}"')
        for row in ledger_failures(root):
            _say(out, "|".join("" if cell is None else str(cell) for cell in row))
        _say(out)
        problems = check_outcome(root) + (
            [] if code == EXIT_TASK_FAILED else [f"the fleet exited {code}, not 1"]
        )
        if problems:
            _say(out, "stella demo: the demo did NOT behave as designed:")
            for problem in problems:
                _say(out, f"  {problem}")
            return EXIT_TASK_FAILED
        _say(
            out,
            "stella demo: everything behaved as designed (the one failure above is the designed conflict).",
        )
        if scratch and not keep:
            _say(
                out,
                "The scratch repository is removed now; run `stella demo DIR` or `--keep` to look around.",
            )
        else:
            _say(out, f"Look around: cd {shlex.quote(str(root))} && stella runs latest")
        return EXIT_OK
    finally:
        if scratch and not keep:
            shutil.rmtree(root.parent, ignore_errors=True)
