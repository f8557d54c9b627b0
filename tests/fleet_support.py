"""Helpers for fleet tests: command-pipeline configs, worker scripts, ledger reads, file barriers."""

from __future__ import annotations

import json
import shlex
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from stellafleet.ledger import Ledger
from stellafleet.paths import StatePaths
from stellafleet.workerenv import WorkerContext

# Python run by every scripted worker: small helpers the scripts below can call.
PRELUDE = """\
import json, os, subprocess, sys, time
from pathlib import Path
TASK = os.environ["STELLA_TASK_ID"]
WS = Path(os.environ["STELLA_WORKSPACE"])
MARKS = Path(os.environ["MARKS"]) if os.environ.get("MARKS") else None

def mark(name, value=""):
    (MARKS / name).write_text(str(value))

def wait_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting for {path}")
        time.sleep(0.02)

def report(**fields):
    Path(os.environ["STELLA_COMMAND_RESULT"]).write_text(json.dumps(fields))

def stella_commit(message, *paths):
    out = subprocess.run(["stella", "commit", "-m", message, *paths], capture_output=True, text=True)
    sys.stdout.write(out.stdout + out.stderr)
    if out.returncode:
        sys.exit(f"stella commit failed: {out.stderr.strip()}")
    return out.stdout.strip()
"""


class Scripts:
    """Worker scripts kept outside the repository (so they never show in its status)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def python(self, name: str, body: str) -> str:
        """A shell command running PRELUDE + body with this interpreter."""
        path = self.directory / f"{name}.py"
        path.write_text(PRELUDE + "\n" + body + "\n")
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


def toml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string for these texts


def write_config(
    root: Path,
    *,
    run: str | None = None,
    tasks: dict[str, str] | None = None,
    extra: str = "",
) -> Path:
    """`.stella/config.toml` for the command pipeline: a default command and per-task commands."""
    lines = ["[pipelines.command]"]
    if run is not None:
        lines.append(f"run = {toml_str(run)}")
    for task_id, command in (tasks or {}).items():
        lines += ["", f"[pipelines.command.tasks.{toml_str(task_id)}]", f"run = {toml_str(command)}"]
    path = StatePaths(root).config_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n\n" + extra)
    return path


def run_record(root: Path, run_id: str | None = None) -> dict[str, Any]:
    """Everything the ledger holds about a run (default: the latest)."""
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.get_run(ledger.resolve_run_id(run_id))


def by_id(rows: list[dict[str, Any]], key: str = "id") -> dict[str, dict[str, Any]]:
    return {row[key]: row for row in rows}


def file_locks(root: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{StatePaths(root).store_db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT path, task_id FROM file_locks").fetchall()
    finally:
        conn.close()


def wait_for(path: Path, timeout: float = 60.0) -> None:
    """Block until path exists (the test's side of a file barrier)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)


RUN = "r-20261130-120000-abcd"


def make_attempt(root: Path, task_id: str = "t1") -> WorkerContext:
    """A ledger run RUN with a started attempt for task_id, and the worker context for it."""
    paths = StatePaths(root)
    paths.private.mkdir(parents=True, exist_ok=True)
    with Ledger.open(paths.fleet_db) as ledger:
        if ledger.latest_run_id() is None:
            ledger.create_run(
                run_id=RUN, plan_path=None, plan_sha256=None, base_ref="main", base_commit="0" * 40,
                max_concurrency=1, spend_limit_usd=None, pipeline="command", argv=[], root=str(root), pid=1,
            )  # fmt: skip
        attempt = ledger.start_attempt(RUN, task_id, pipeline="command")
    return WorkerContext(
        root=root,
        workspace=root,
        run_id=RUN,
        task_id=task_id,
        task_title="a task",
        attempt_id=attempt,
        prompt="do the thing",
        isolation="shared",
        branch=None,
        base_commit="0" * 40,
        spend_guard_usd=None,
        pipeline="command",
        model=None,
        timeout_s=None,
        result_path=paths.result_file(RUN, task_id, attempt),
        log_path=paths.log_file(RUN, task_id),
        transcript_path=paths.transcript_file(RUN, task_id),
    )
