"""The scratch repository of `stella demo`: a small project, the demo plan and its config."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops

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
        f"[pipelines.command]\nrun = {_toml(worker_command())}\n"
    )


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
