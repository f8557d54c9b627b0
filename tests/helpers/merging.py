"""A finished fleet run with four fleet/* branches, for `stella merge` tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.repo import git
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CIState
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN_ID = "r-20261201-050000-abcd"


@dataclass
class Branches:
    root: Path
    heads: dict[str, str]

    def branch(self, task: str) -> str:
        return f"fleet/{task}-abcd"


def commit_on(root: Path, branch: str, start: str, files: dict[str, str]) -> str:
    git("switch", "-q", "-c", branch, start, cwd=root)
    for name, text in files.items():
        (root / name).write_text(text)
        git("add", name, cwd=root)
    git("commit", "-qm", f"{branch}: work", cwd=root)
    sha = git("rev-parse", "HEAD", cwd=root).strip()
    git("switch", "-q", "main", cwd=root)
    return sha


def build_run(root: Path, *, ci: dict[str, CIState] | None = None, prs: bool = False) -> Branches:
    """A finished run: a, b (depends on a, built on a), c (conflicts with a in README.md), d (fails the
    check); listed b, a, c, d so dependency order, not listing order, has to put a first."""
    base = git("rev-parse", "HEAD", cwd=root).strip()
    heads = {
        "a": commit_on(root, "fleet/a-abcd", base, {"README.md": "# changed by a\n", "a.txt": "a\n"}),
    }
    heads["b"] = commit_on(root, "fleet/b-abcd", heads["a"], {"b.txt": "b\n"})
    heads["c"] = commit_on(root, "fleet/c-abcd", base, {"README.md": "# changed by c\n", "c.txt": "c\n"})
    heads["d"] = commit_on(root, "fleet/d-abcd", base, {"bad.txt": "oops\n"})
    deps = {"b": ("a",)}
    tasks = [
        sample_task(t, title=f"task {t}", isolation="isolated", depends_on=deps.get(t, ()))
        for t in ("b", "a", "c", "d")
    ]
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(root))
        ledger.tasks.add(RUN_ID, tasks, {t.id: 1 for t in tasks})
        for task in tasks:
            branch = f"fleet/{task.id}-abcd"
            ledger.tasks.set_workspace(RUN_ID, task.id, branch, None)
            ledger.tasks.set_status(RUN_ID, task.id, "succeeded")
            state = (ci or {}).get(task.id, CIState.GREEN)
            ledger.ci.upsert(
                run_id=RUN_ID,
                branch=branch,
                task_id=task.id,
                head_sha=heads[task.id],
                pr_url=f"https://github.example/octo/widgets/pull/{ord(task.id) - 96}" if prs else None,
                pr_number=ord(task.id) - 96 if prs else None,  # a #1, b #2, ...
                state=state,
                conclusion=None,
                reason=None,
                run_urls=[],
            )
        ledger.runs.finish(RUN_ID, "succeeded", exit_code=0)
    return Branches(root, heads)


def merges(root: Path) -> list[dict[str, Any]]:
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.get_run(RUN_ID)["merges"]


def build_disjoint_run(root: Path, files: dict[str, dict[str, str]]) -> dict[str, str]:
    """A finished run of isolated tasks, each its branch fleet/<task>-abcd off main changing files[task],
    all green; the heads by task."""
    base = git("rev-parse", "HEAD", cwd=root).strip()
    heads = {task: commit_on(root, f"fleet/{task}-abcd", base, changed) for task, changed in files.items()}
    tasks = [sample_task(t, title=f"task {t}", isolation="isolated") for t in files]
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(root))
        ledger.tasks.add(RUN_ID, tasks, {t.id: 1 for t in tasks})
        for task in tasks:
            ledger.tasks.set_workspace(RUN_ID, task.id, f"fleet/{task.id}-abcd", None)
            ledger.tasks.set_status(RUN_ID, task.id, "succeeded")
        ledger.runs.finish(RUN_ID, "succeeded", exit_code=0)
    return heads
