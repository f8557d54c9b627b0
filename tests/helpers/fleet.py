"""Helpers for fleet tests: command-pipeline configs, worker scripts, ledger reads, file barriers."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.plan.model import PlanTask
from stellafleet.proc.tree import Exit, ProcessTree
from stellafleet.run.steps import AttemptState, RunSettings
from stellafleet.run.steps.check import Check
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger
from stellafleet.state.proof import new_token
from stellafleet.testing.sample_ledger import add_run

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
        return ledger.get_run(ledger.runs.resolve(run_id))


def by_id(rows: list[dict[str, Any]], key: str = "id") -> dict[str, dict[str, Any]]:
    return {row[key]: row for row in rows}


def file_locks(root: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{StatePaths(root).store_db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT path, task_id FROM file_locks").fetchall()
    finally:
        conn.close()


def wait_exit(tree: ProcessTree, timeout: float = 30.0) -> Exit:
    """Wait for a worker's process tree to end (failing the test after timeout seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = tree.wait(0.5)
        if done is not None:
            return done
    raise AssertionError(f"the process {tree.pid} did not exit within {timeout:g}s")


def install_pipeline(site: Path, name: str, entry: str, source: str) -> dict[str, str]:
    """Install a pipeline plugin into site as an installer lays it out: its module and a .dist-info with
    the `stella.pipelines` entry point `name = entry`. Returns the environment that puts site on the path
    of a process (a worker finds it by name, as the fleet does)."""
    module = entry.partition(":")[0]
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[stella.pipelines]\n{name} = {entry}\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


class Polled(Protocol):
    """A process a test waits on: subprocess.Popen, ProcessTree (poll() is None while it runs)."""

    pid: int

    def poll(self) -> Any: ...


def wait_until(
    condition: Callable[[], bool], what: str, *, process: Polled | None = None, timeout: float = 60.0
) -> None:
    """Block until condition() holds (checked every few ms: the event itself, not a guessed sleep).
    When process ends first, fail at once, naming how it ended, instead of waiting out the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = process.poll() if process is not None else None
        if ended is not None:
            if condition():  # it did its part just before it ended
                return
            how = ended.describe() if hasattr(ended, "describe") else f"exit status {ended}"
            raise AssertionError(f"process {process.pid} ended ({how}) before {what}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.005)


def wait_for(path: Path, timeout: float = 60.0, *, process: Polled | None = None) -> None:
    """Block until path exists (the test's side of a file barrier); fails at once if process ends first."""
    wait_until(path.exists, f"{path} to appear", process=process, timeout=timeout)


RUN = "r-20261130-120000-abcd"


def worker_context(
    root: Path,
    *,
    run_id: str = RUN,
    task_id: str = "t1",
    attempt_id: int = 1,
    pipeline: str = "command",
    title: str = "a task",
    prompt: str = "do the thing",
    base_commit: str = "0" * 40,
    workspace: Path | None = None,
    isolation: str = "shared",
    branch: str | None = None,
    guard: float | None = None,
    model: str | None = None,
    timeout: float | None = None,
    token: str | None = None,
) -> WorkerContext:
    """The context a worker for this attempt gets, with the state paths the fleet gives it."""
    paths = StatePaths(root)
    return WorkerContext(
        root=root,
        workspace=workspace or root,
        run_id=run_id,
        task_id=task_id,
        task_title=title,
        attempt_id=attempt_id,
        prompt=prompt,
        isolation=isolation,
        branch=branch,
        base_commit=base_commit,
        spend_guard_usd=guard,
        pipeline=pipeline,
        model=model,
        timeout_s=timeout,
        result_path=paths.result_file(run_id, task_id, attempt_id),
        log_path=paths.log_file(run_id, task_id),
        transcript_path=paths.transcript_file(run_id, task_id),
        token=token,
    )


def make_attempt(root: Path, task_id: str = "t1") -> WorkerContext:
    """A ledger run RUN with a started attempt for task_id (its worker's pid not recorded, as when the worker
    runs elsewhere), and the worker context for it, its secret included."""
    paths = StatePaths(root)
    paths.private.mkdir(parents=True, exist_ok=True)
    token, digest = new_token()
    with Ledger.open(paths.fleet_db) as ledger:
        if ledger.runs.latest_id() is None:
            add_run(ledger, RUN, argv=[], root=str(root), pid=1)
        attempt = ledger.attempts.start(RUN, task_id, pipeline="command", token_sha256=digest)
    return worker_context(root, task_id=task_id, attempt_id=attempt, token=token)


def attempt_facts(root: Path, attempt_id: int) -> dict[str, Any]:
    """What the ledger's attempt_facts hold for one attempt."""
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.facts.of_attempt(attempt_id)


@contextlib.contextmanager
def run_of_one_task(root: Path, task: PlanTask) -> Iterator[tuple[Path, Ledger, ClaimStore]]:
    """The repository's ledger and claim store, holding run RUN (based on HEAD) with task in its first
    wave: what a Dispatcher built by hand runs attempts against."""
    paths = StatePaths(root)
    paths.private.mkdir(parents=True, exist_ok=True)
    head = gitops.head_commit(root)
    with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as store:
        add_run(ledger, RUN, base_commit=head, root=str(root))
        ledger.tasks.add(RUN, [task], {task.id: 1})
        yield root, ledger, store


def check_attempt(
    root: Path, ledger: Ledger, task: PlanTask, config: Config | None = None, **ctx: Any
) -> tuple[Check, AttemptState]:
    """The Check step of run RUN (already in ledger) and an opened attempt of task, its worker context
    built from ctx (worker_context's options): for the in-process tests of a task's check."""
    ledger.tasks.add(RUN, [task], {task.id: 1})
    attempt_id = ledger.attempts.start(RUN, task.id, pipeline="command")
    context = worker_context(root, task_id=task.id, attempt_id=attempt_id, **ctx)
    attempt = AttemptState(task, threading.Event(), context=context, env=context.to_env(), prompt=task.prompt)
    return Check(RunSettings(root, RUN, "0" * 40, "command", config=config or Config()), ledger), attempt
