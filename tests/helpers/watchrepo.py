"""A finished fleet run in a real repository, for the watch tests: a bare repository as origin, the run's
branches and commits made for real, the run recorded in the ledger as the fleet records it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN_ID = "r-20261130-124501-9f3a"


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def git(*args: str, cwd: Path) -> str:
    return sh("git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args, cwd=cwd)


@dataclass
class Repo:
    root: Path
    origin: Path
    tmp: Path
    shas: dict[str, str] = field(default_factory=dict)  # task id -> head commit of its work

    @property
    def db(self) -> Path:
        return StatePaths(self.root).fleet_db

    def remote_sha(self, branch: str) -> str | None:
        out = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
            cwd=self.origin,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out or None

    def ci_rows(self, run_id: str = RUN_ID) -> list[dict[str, Any]]:
        with Ledger.open(self.db, readonly=True) as ledger:
            return ledger.get_run(run_id)["ci"]

    def add_run(
        self,
        run_id: str = RUN_ID,
        *,
        isolated: tuple[str, ...] = ("t1",),
        shared: tuple[str, ...] = (),
        failed: tuple[str, ...] = (),
        shared_branch: str = "main",
        ci_result: str | None = None,
        stacked: dict[str, str] | None = None,
    ) -> None:
        """A finished run in the ledger, with real branches and commits for its tasks; stacked: an isolated
        task -> the earlier isolated task it started from (base = "parents"), its branch on that one's."""
        stacked = stacked or {}

        def stack_of(t: str) -> dict[str, Any]:
            return {"depends_on": (stacked[t],), "base": "parents"} if t in stacked else {}

        tasks = [
            sample_task(t, title=f"Title of {t}", isolation="isolated", pipeline="command", **stack_of(t))
            for t in isolated
        ]
        tasks += [sample_task(t, title=f"Title of {t}", pipeline="command") for t in shared]
        with Ledger.open(self.db) as ledger:
            base = git("rev-parse", "HEAD", cwd=self.root)
            add_run(ledger, run_id, base_ref="HEAD", base_commit=base, max_concurrency=2, root=str(self.root))
            ledger.tasks.add(run_id, tasks, {t.id: 1 for t in tasks})
            for task in tasks:
                branch = f"fleet/{task.id}-{run_id[-4:]}" if task.isolation == "isolated" else shared_branch
                if task.isolation == "isolated" or branch not in git(
                    "branch", "--list", branch, cwd=self.root
                ):
                    git("branch", branch, self.shas.get(stacked.get(task.id, ""), base), cwd=self.root)
                    ledger.tasks.set_workspace(run_id, task.id, branch, str(self.tmp / "wt" / task.id))
                attempt = ledger.attempts.start(run_id, task.id, pipeline="command", branch=branch)
                ledger.spend.add(attempt, 0.42, input_tokens=100, output_tokens=20, steps=3)
                git("switch", "-q", branch, cwd=self.root)
                (self.root / f"{task.id}-{run_id}.txt").write_text(f"work of {task.id}\n")
                git("add", f"{task.id}-{run_id}.txt", cwd=self.root)
                if ci_result is not None:  # what the local GitHub API server's simulated CI concludes
                    (self.root / ".ci-result").write_text(f"{ci_result}\n")
                    git("add", ".ci-result", cwd=self.root)
                git("commit", "-qm", f"{task.id}: add work", cwd=self.root)
                sha = git("rev-parse", "HEAD", cwd=self.root)
                git("switch", "-q", "main", cwd=self.root)
                self.shas[task.id] = sha
                ledger.commits.record(
                    [(sha, f"{task.id}: add work", 1)],
                    run_id=run_id,
                    task_id=task.id,
                    attempt_id=attempt,
                    branch=branch,
                )
                ok = task.id not in failed
                ledger.attempts.finish(
                    attempt,
                    AttemptEnd(
                        outcome="succeeded" if ok else "failed",
                        exit_code=0 if ok else 1,
                        summary=f"Summary of {task.id}: added the work file.",
                    ),
                )
                ledger.tasks.set_status(run_id, task.id, "succeeded" if ok else "failed")
            ledger.runs.finish(
                run_id, "succeeded" if not failed else "failed", exit_code=0 if not failed else 1
            )


def make_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, origin: Path | None = None, url: str | None = None
) -> Repo:
    """A repository with one commit on main, pushed to origin: a new bare repository, or url (whose
    bare repository is at origin)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if origin is None:
        origin = tmp_path / "origin.git"
        sh("git", "init", "-q", "--bare", "-b", "main", str(origin), cwd=tmp_path)
    root = tmp_path / "repo"
    root.mkdir()
    git("init", "-q", "-b", "main", cwd=root)
    (root / "README").write_text("hello\n")
    git("add", "README", cwd=root)
    git("commit", "-qm", "first", cwd=root)
    git("remote", "add", "origin", url or str(origin), cwd=root)
    git("push", "-q", "origin", "main", cwd=root)
    return Repo(root.resolve(), origin, tmp_path)
