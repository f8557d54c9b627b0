"""`stella demo`: a real fleet, offline, in a scratch repository (a small project, the demo plan and its
config), with only the workers' edits simulated."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO

from stellafleet.core import jsontext
from stellafleet.core.errors import EXIT_OK, EXIT_TASK_FAILED, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import TaskStatus
from stellafleet.git import gitops
from stellafleet.proc import runner
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_attempts import FAILED_IN_LATEST_RUN

PLAN_NAME = "fleet-demo.toml"
WORKER_MODULE = "stellafleet.demo.worker"

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

SCAFFOLD = {
    "README.md": "# demo store\n\nA scratch repository made by `stella demo`.\n",
    "src/store/mod.rs": "pub mod schema;\n",
    "docs/receipts.md": "# Receipts\n\nTo be written.\n",
}


def worker_command() -> str:
    """The shell line the command pipeline runs for every task: this Python, the simulated worker."""
    return shlex.join([sys.executable, "-m", WORKER_MODULE])


def config_text() -> str:
    """The repository's .stella/config.toml: every task runs the simulated worker."""
    return (
        "# stella demo: every task runs the simulated worker through the command pipeline\n"
        f"[pipelines.command]\nrun = {jsontext.dumps(worker_command(), ensure_ascii=False)}\n"
    )


def create_repository(root: Path) -> None:
    """A fresh repository at root (new or empty) with the small project, the demo plan and the config."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise StellaError(f"{root} is not empty: give `stella demo` a new or empty directory")
    gitops.git("init", "-q", cwd=root)
    gitops.git("symbolic-ref", "HEAD", "refs/heads/main", cwd=root)
    gitops.git("config", "user.name", "stella demo", cwd=root)
    gitops.git("config", "user.email", "demo@stellafleet.invalid", cwd=root)
    gitops.git("config", "commit.gpgsign", "false", cwd=root)
    config = StatePaths(root).config_file.relative_to(root).as_posix()
    files = {**SCAFFOLD, PLAN_NAME: PLAN, config: config_text()}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    gitops.git("add", "--", *files, cwd=root)
    gitops.git("commit", "-q", "-m", "demo project", cwd=root)


INTRODUCTION = """\
  The workers' edits are SIMULATED by a small script (the `command` pipeline) instead of a
  model: no network, no API key. Everything else is real: worker processes, file claims,
  the commit lane, an isolated worktree on a fleet/* branch, and the ledger.
  One failure is part of the demo: changelog and release-notes both claim CHANGELOG.md in
  wave 1, so the second to dispatch fails naming the first, and the fleet exits 1.
"""


def _say(out: IO[str], text: str = "") -> None:
    print(text, file=out, flush=True)


def check_outcome(root: Path) -> list[str]:
    """What differed from the design (empty: the demo behaved as designed)."""
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(ledger.runs.resolve(None))
    status = {task["id"]: task for task in record["tasks"]}
    problems = []
    for task_id in ("schema", "reader", "writer", "docs"):
        if status[task_id]["status"] != TaskStatus.SUCCEEDED:
            problems.append(f"{task_id} ended {status[task_id]['status']}: {status[task_id]['reason']}")
    pair = [status["changelog"], status["release-notes"]]
    failed = [t for t in pair if t["status"] == TaskStatus.FAILED]
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


def show_fleet(out: IO[str], root: Path) -> int:
    """Introduce the demo, run the fleet; returns the fleet's exit code."""
    args = ["fleet", "--plan", PLAN_NAME, "--max-concurrency", "4"]
    _say(out, f"stella demo: a scratch repository at {root}\n{INTRODUCTION}\n$ stella {shlex.join(args)}")
    # the fleet, exactly as a user runs it (its output goes straight to the terminal)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}
    argv = [sys.executable, "-m", "stellafleet", *args]
    done = runner.run(argv, cwd=root, env=env, stdout=runner.INHERIT, stderr=runner.INHERIT, session=False)
    _say(out, f"(the fleet exited {done.returncode})\n")
    return done.returncode


def show_results(out: IO[str], root: Path) -> None:
    """What the run left behind: the shared branch, the fleet branches, the failed attempts."""
    for argv in (["log", "--oneline", "main"], ["branch", "--list", "fleet/*"]):
        _say(out, f"$ git {shlex.join(argv)}\n{gitops.git(*argv, cwd=root).rstrip()}")
    _say(out)
    _say(out, "Which tasks failed in the most recent run, what the worker said and why it failed:")
    _say(out, f'$ sqlite3 .stella/private/fleet.db "{" ".join(FAILED_IN_LATEST_RUN.split())}"')
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        failures = ledger.attempts.failed_in_latest_run()
    for row in failures:
        _say(out, "|".join("" if cell is None else str(cell) for cell in row))
    _say(out)


def conclude(out: IO[str], root: Path, code: int, *, removed: bool) -> int:
    """The verdict on the run against the design; returns the demo's exit code."""
    problems = check_outcome(root) + ([] if code == EXIT_TASK_FAILED else [f"the fleet exited {code}, not 1"])
    if problems:
        _say(out, "stella demo: the demo did NOT behave as designed:")
        for problem in problems:
            _say(out, f"  {problem}")
        return EXIT_TASK_FAILED
    _say(out, "stella demo: everything behaved as designed (the one failure above is the designed conflict).")
    if removed:
        _say(out, "The scratch repository is removed now; run `stella demo DIR` or `--keep` to look around.")
    else:
        _say(out, f"Look around: cd {shlex.quote(str(root))} && stella runs latest")
    return EXIT_OK


def run_demo(directory: Path | None, *, keep: bool, out: IO[str] | None = None) -> int:
    """Create the repository (in directory, else a scratch one), run the fleet, show and check it."""
    out = out or sys.stdout
    scratch = directory is None
    root = (
        Path(tempfile.mkdtemp(prefix="stella-demo-")) / "repo" if directory is None else directory.resolve()
    )
    try:
        create_repository(root)
        code = show_fleet(out, root)
        show_results(out, root)
        return conclude(out, root, code, removed=scratch and not keep)
    finally:
        if scratch and not keep:
            shutil.rmtree(root.parent, ignore_errors=True)
