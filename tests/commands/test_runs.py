"""`stella runs` as a subprocess: the table of runs, one run in detail, JSON, prefixes and `latest`."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.repo import stella_here

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops, worktrees
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import build_sample_ledger


def stella(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return stella_here(*args, cwd=repo, env={"HOME": str(repo.parent), "NO_COLOR": "1"}, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    gitops.git("init", "-q", "-b", "main", cwd=path)
    return path


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def ids(repo: Path, sleeper: subprocess.Popen[bytes]) -> dict[str, str]:
    ids = build_sample_ledger(StatePaths(repo).fleet_db, live_pid=sleeper.pid)
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        # markup-looking text from a model is printed as it is, never interpreted
        attempt = ledger.get_run(ids["running"])["attempts"][0]["id"]
        ledger.attempts.finish(
            attempt, AttemptEnd(outcome="failed", exit_code=1, summary="[bold red]boom[/] <b>x</b>")
        )
        ledger.tasks.set_status(ids["running"], "bump", "running")  # the run stays in progress
    return ids


def test_table_lists_runs_newest_first(repo: Path, ids: dict[str, str]) -> None:
    result = stella(repo, "runs")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["RUN", "STARTED", "DURATION", "STATUS"]
    assert [line.split()[0] for line in lines[1:4]] == [ids["running"], ids["failed"], ids["ok"]]
    ok_line = next(line for line in lines if line.startswith(ids["ok"]))
    assert "succeeded" in ok_line and "3/0/0" in ok_line and "$2.40 / $6.00" in ok_line
    assert "main @ 3f2a9c1e5b" in ok_line and "3m 09s" in ok_line
    failed_line = next(line for line in lines if line.startswith(ids["failed"]))
    assert "failed" in failed_line and "1/1/1" in failed_line and "$0.47 (no limit)" in failed_line
    assert "\x1b[" not in result.stdout  # plain text when piped


def test_limit_and_json(repo: Path, ids: dict[str, str]) -> None:
    limited = stella(repo, "runs", "--limit", "2")
    assert "(2 of 3 runs; --limit N shows more)" in limited.stdout
    assert ids["ok"] not in limited.stdout
    page = json.loads(stella(repo, "runs", "--json").stdout)
    assert page["total"] == 3
    assert [r["id"] for r in page["runs"]] == [ids["running"], ids["failed"], ids["ok"]]
    running = page["runs"][0]
    assert running["live"] is True and running["status"] == "running"
    assert running["tasks"]["running"] == 1 and running["tasks"]["pending"] == 1


def test_latest_json_has_tasks_attempts_commits_spend_branches_and_ci(
    repo: Path, ids: dict[str, str]
) -> None:
    latest = json.loads(stella(repo, "runs", "latest", "--json").stdout)
    assert latest["run"]["id"] == ids["running"]
    assert latest["run"]["spend_limit_usd"] == 5.0
    [task] = latest["waves"][0]["tasks"]
    assert task["id"] == "bump" and task["attempts"][0]["summary"] == "[bold red]boom[/] <b>x</b>"

    ok = json.loads(stella(repo, "runs", ids["ok"][:-2], "--json").stdout)  # a unique prefix
    assert ok["run"]["id"] == ids["ok"]
    assert [w["wave"] for w in ok["waves"]] == [1, 2, 3]
    docs = ok["waves"][2]["tasks"][0]
    assert docs["branch"] == "fleet/docs-5c1d7e9a0b2f4a6c" and docs["ci"]["state"] == "green"
    assert docs["attempts"][0]["spend_usd"] == pytest.approx(1.12)
    assert len(ok["commits"]) == 3
    branches = {b["branch"]: b for b in ok["branches"]}
    assert branches["fleet/docs-5c1d7e9a0b2f4a6c"]["commits"] == 1
    assert branches["fleet/docs-5c1d7e9a0b2f4a6c"]["ci"]["pr_number"] == 412
    assert branches["main"]["tasks"] == ["schema", "reader"]


def test_detail_text_names_skips_errors_and_summaries(repo: Path, ids: dict[str, str]) -> None:
    result = stella(repo, "runs", ids["failed"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"run {ids['failed']}  failed  (exit 1)")
    assert "reason: dependency failed: writer" in out
    assert "error: tests failed: test_emit_records_receipt" in out
    assert "summary: Fixed 7 warnings in store/." in out
    latest = stella(repo, "runs", "latest").stdout
    assert "summary: [bold red]boom[/] <b>x</b>" in latest


def test_terminal_output_uses_rich_and_keeps_model_text_literal(repo: Path, ids: dict[str, str]) -> None:
    leader, follower = pty.openpty()
    env = {**os.environ, "HOME": str(repo.parent), "COLUMNS": "200", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "stellafleet", "runs", "latest"],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode()
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" in text  # styled for a terminal
    assert "[bold red]boom[/] <b>x</b>" in text


def test_prefix_errors_and_missing_ledger(repo: Path, ids: dict[str, str], tmp_path: Path) -> None:
    ambiguous = stella(repo, "runs", "r-")
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.startswith("stella: error: 'r-' matches several runs (")
    assert len(ambiguous.stderr.strip().splitlines()) == 1

    empty = tmp_path / "empty"
    empty.mkdir()
    gitops.git("init", "-q", cwd=empty)
    listed = stella(empty, "runs")
    assert listed.returncode == 0
    assert "No fleet runs recorded yet" in listed.stdout and 'stella fleet "' in listed.stdout
    assert json.loads(stella(empty, "runs", "--json").stdout)["runs"] == []
    missing = stella(empty, "runs", "latest")
    assert missing.returncode == 2 and "no fleet runs recorded yet" in missing.stderr
    assert not StatePaths(empty).fleet_db.exists()
    assert stella(empty, "runs", "--limit", "0").returncode == 2


def test_inside_a_fleet_worktree_the_main_trees_ledger_is_read(repo: Path, ids: dict[str, str]) -> None:
    gitops.git(
        "-c",
        "user.name=T",
        "-c",
        "user.email=t@e.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "i",
        cwd=repo,
    )
    linked = StatePaths(repo).worktrees / "docs-0123456789abcdef"
    worktrees.worktree_add(repo, linked, "fleet/docs-0123456789abcdef", gitops.head_commit(repo))
    page = json.loads(stella(linked, "runs", "--json").stdout)
    assert page["total"] == 3 and page["ledger"] == str(StatePaths(repo).fleet_db)


def test_attempts_are_numbered_per_task_for_people_and_keep_the_ledger_id_in_json(
    repo: Path, ids: dict[str, str]
) -> None:
    """The failed run's attempts are the ledger's third and fourth: each task's first reads `attempt 1`."""
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        [writer, lint] = ledger.get_run(ids["failed"])["attempts"]
        again = ledger.attempts.start(ids["failed"], "writer", pipeline="plain")
        ledger.attempts.finish(again, AttemptEnd(outcome="failed", exit_code=1, summary="still failing"))
    assert writer["id"] > 1 and lint["id"] > 1
    shown = stella(repo, "runs", ids["failed"]).stdout
    lines = [line.strip().split()[:3] for line in shown.splitlines() if line.strip().startswith("attempt")]
    assert lines == [["attempt", "1", "failed"], ["attempt", "2", "failed"], ["attempt", "1", "succeeded"]]
    assert "#" not in "".join(line for line in shown.splitlines() if "attempt" in line)
    doc = json.loads(stella(repo, "runs", ids["failed"], "--json").stdout)
    tasks = {task["id"]: task for wave in doc["waves"] for task in wave["tasks"]}
    assert [(a["id"], a["number"]) for a in tasks["writer"]["attempts"]] == [(writer["id"], 1), (again, 2)]
    assert [(a["id"], a["number"]) for a in tasks["lint"]["attempts"]] == [(lint["id"], 1)]


def test_an_attempts_reason_is_shown_once(repo: Path, ids: dict[str, str]) -> None:
    """The task's reason, the attempt's error and its recorded reason were one text, printed three times."""
    said = "stopped: no progress for 1s (idle_timeout)"
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        attempt = ledger.attempts.start(ids["failed"], "report", pipeline="plain")
        ledger.attempts.set_reason(attempt, said)
        ledger.attempts.finish(attempt, AttemptEnd(outcome="stalled", exit_code=-15, summary="", error=said))
    shown = stella(repo, "runs", ids["failed"]).stdout
    assert shown.count(said) == 1, shown
    assert f"reason: {said}" in shown  # the task's line says it
