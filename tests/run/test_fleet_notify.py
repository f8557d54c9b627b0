"""`[notify] command`: the user's command hears about failures, stalls, the spend limit and the run's end."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from helpers.fleet import Scripts, write_config
from helpers.repo import StellaRunner


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _notify(command: str, timeout: float = 5) -> str:
    return f"[notify]\ncommand = {json.dumps(command)}\ntimeout = {timeout}\n"


def test_a_failed_task_and_the_runs_end_reach_the_notify_command(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    events = tmp_path / "events.jsonl"
    write_config(
        git_repo,
        run="true",
        tasks={"t2": "echo broken; exit 3"},
        extra=_notify(f"cat >> {shlex.quote(str(events))}"),
    )

    proc = stella_main("fleet", "--pipeline", "command", "fine", "broken", cwd=git_repo)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    told = _events(events)
    assert [event["event"] for event in told] == ["task_failed", "run_ended"]
    failed, ended = told
    assert failed["task"] == "t2" and failed["outcome"] == "failed" and "exit" in failed["text"]
    assert failed["run_id"] == ended["run_id"] and ended["root"] == str(git_repo)
    assert ended["status"] == "failed" and ended["exit_code"] == 1
    assert ended["tasks"] == {"succeeded": 1, "failed": 1}


SPENDER = 'report(spend_usd=0.6, summary=f"{TASK} spent 0.60")\n'


def test_reaching_the_spend_limit_is_told_once(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    events = tmp_path / "events.jsonl"
    scripts = Scripts(tmp_path / "scripts")
    write_config(
        git_repo,
        run=scripts.python("spend", SPENDER),
        extra=_notify(f"cat >> {shlex.quote(str(events))}"),
    )

    proc = stella_main(
        "--spend-limit", "1", "fleet", "--pipeline", "command", "--max-concurrency", "2", "a", "b", "c", "d",
        cwd=git_repo,
    )  # fmt: skip

    assert proc.returncode == 3, proc.stdout + proc.stderr
    told = _events(events)
    assert [event["event"] for event in told] == ["spend_limit", "run_ended"]
    assert told[0]["spend_usd"] == 1.2 and told[0]["spend_limit_usd"] == 1.0
    assert told[1]["status"] == "spend_limited" and told[1]["exit_code"] == 3


def test_a_failing_or_hanging_notify_command_never_fails_the_run(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="true", extra=_notify("echo no webhook today >&2; exit 7"))
    proc = stella_main("fleet", "--pipeline", "command", "fine", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "notify command exited 7 (run_ended): no webhook today" in proc.stderr

    write_config(git_repo, run="true", extra=_notify("sleep 60", timeout=0.5))
    started = time.monotonic()
    proc = stella_main("fleet", "--pipeline", "command", "fine", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "notify command stopped after 0.5s (run_ended)" in proc.stderr
    assert time.monotonic() - started < 30
