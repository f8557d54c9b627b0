"""The demo's simulated worker, run as the command pipeline runs it: `python -m stellafleet.demo.worker`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers.fleet import RUN, make_attempt
from helpers.repo import git

from stellafleet.core.status import AttemptEnd
from stellafleet.core.workercontext import WorkerContext
from stellafleet.demo.tour import config_text, worker_command
from stellafleet.pipelines.command import RESULT_ENV
from stellafleet.state.ledger import Ledger


def run_worker(ctx: WorkerContext | None, cwd: Path, result: Path) -> subprocess.CompletedProcess[str]:
    """The worker as the command pipeline starts it: its shell line, the task's STELLA_* environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}
    if ctx is not None:
        env |= {**ctx.to_env(), RESULT_ENV: str(result)}
    return subprocess.run(
        ["/bin/sh", "-c", worker_command()], cwd=cwd, env=env, capture_output=True, text=True, timeout=30
    )


def test_it_writes_the_task_files_commits_exactly_them_and_reports_a_summary(git_repo: Path) -> None:
    ctx = dataclasses.replace(make_attempt(git_repo, "schema"), task_title="Add the migration")
    (git_repo / "notes.txt").write_text("the user's own work in progress\n")
    result = git_repo.parent / "result.json"

    proc = run_worker(ctx, git_repo, result)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    sha = git("rev-parse", "HEAD", cwd=git_repo).strip()
    assert git("log", "-1", "--format=%s", cwd=git_repo).strip() == "Add the migration"
    committed = git("show", "--name-only", "--format=", "HEAD", cwd=git_repo).split()
    assert sorted(committed) == ["src/store/migrations.rs", "src/store/schema.rs"]
    status = git("status", "--porcelain", "--", ".", ":!.stella", cwd=git_repo).splitlines()
    assert status == ["?? notes.txt"]  # committed clean, and the user's file left alone
    summary = f"(simulated) add the migration: committed {sha[:12]}"
    assert json.loads(result.read_text()) == {"summary": summary, "steps": 1}
    assert proc.stdout.splitlines() == [sha, summary]
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        commits = ledger.get_run(RUN)["commits"]
    assert [(c["sha"], c["task_id"], c["branch"]) for c in commits] == [(sha, "schema", "main")]


def test_a_conflicting_task_goes_ahead_once_the_other_claimant_has_failed(git_repo: Path) -> None:
    turned_away = make_attempt(git_repo, "release-notes")
    with Ledger.open(turned_away.paths.fleet_db) as ledger:
        ledger.attempts.finish(
            turned_away.attempt_id,
            AttemptEnd(outcome="failed", exit_code=None, summary="claim conflict: CHANGELOG.md"),
        )
    ctx = make_attempt(git_repo, "changelog")
    result = git_repo.parent / "result.json"

    proc = run_worker(ctx, git_repo, result)  # waits for the failure first: it is in the ledger already

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (git_repo / "CHANGELOG.md").read_text() == "# Changelog\n\n- receipts table\n"
    assert git("show", "--name-only", "--format=", "HEAD", cwd=git_repo).split() == ["CHANGELOG.md"]


def test_outside_a_fleet_worker_it_refuses_in_one_line(git_repo: Path) -> None:
    proc = run_worker(None, git_repo, git_repo.parent / "result.json")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not inside a fleet worker" in lines[0]
    assert git("rev-list", "--count", "HEAD", cwd=git_repo).strip() == "1"


def test_the_config_runs_this_python_even_from_a_path_with_spaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "my python's dir" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))

    command = tomllib.loads(config_text())["pipelines"]["command"]["run"]
    proc = subprocess.run(
        ["/bin/sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )

    assert proc.returncode == 2, proc.stderr  # it ran: the worker's own refusal outside a fleet
    assert proc.stderr.startswith("stella demo worker: not inside a fleet worker")
