"""Agent-CLI pipelines through a real `stella fleet` with fake CLIs: a crash next to a success, preflight.

The success paths, mixed plans and claim conflicts run the real CLIs in test_real_*.py; these keep the fakes
because a real CLI cannot be made to crash on demand, and a preflight refusal starts no CLI at all.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops
from stellafleet.testing.fake_agent import LOG_ENV, SCRIPT_ENV, read_log, write_shims


def agent_env(tmp_path: Path, script: Mapping[str, Any]) -> dict[str, str]:
    bin_dir = write_shims(tmp_path / "fake-bin")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        SCRIPT_ENV: json.dumps(script),
        LOG_ENV: str(tmp_path / "fake-agents.jsonl"),
    }


def write_plan(tmp_path: Path, tasks: Sequence[Mapping[str, Any]]) -> Path:
    lines: list[str] = []
    for task in tasks:
        lines.append("[[tasks]]")
        for key, value in task.items():
            lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    path = tmp_path / "plan.toml"
    path.write_text("\n".join(lines))
    return path


def files_of(root: Path, sha: str) -> list[str]:
    return git("show", "--name-only", "--format=", sha, cwd=root).split()


def test_claude_success_and_crash_land_in_the_ledger(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    script = {
        "tasks": {
            "ok": {
                "edits": [{"path": "src/app.py", "content": "print('hi')\n"}],
                "commit": {"message": "Add the app"},
                "cost": 0.0437,
                "num_turns": 5,
                "result": "Added src/app.py and committed it.",
            },
            "boom": {"mode": "crash", "exit_code": 1, "stderr": "Error: Invalid API key"},
        }
    }
    plan = write_plan(
        tmp_path,
        [
            {"id": "ok", "prompt": "Add the app", "pipeline": "claude-code"},
            {"id": "boom", "prompt": "Break things", "pipeline": "claude-code"},
        ],
    )
    env = agent_env(tmp_path, script)
    base = gitops.head_commit(git_repo)
    proc = stella_main(
        "--spend-limit", "1", "fleet", "--plan", str(plan), "--max-concurrency", "2", cwd=git_repo, env=env
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr

    record = run_record(git_repo)
    assert record["run"]["status"] == "failed"
    tasks = by_id(record["tasks"])
    assert (tasks["ok"]["status"], tasks["boom"]["status"]) == ("succeeded", "failed")
    attempts = by_id(record["attempts"], "task_id")
    ok = attempts["ok"]
    assert (ok["outcome"], ok["pipeline"], ok["summary"]) == (
        "succeeded",
        "claude-code",
        "Added src/app.py and committed it.",
    )
    assert ok["spend_usd"] == pytest.approx(0.0437)
    assert (ok["steps"], ok["input_tokens"], ok["output_tokens"]) == (5, 10120, 450)
    boom = attempts["boom"]
    assert boom["outcome"] == "failed"
    assert boom["summary"] == "claude ended (exit status 1) before reporting a result: Error: Invalid API key"
    assert boom["spend_usd"] == 0
    assert record["run"]["spend_usd"] == pytest.approx(0.0437)

    # the agent committed through `stella commit`: one commit, its own file, recorded for its attempt
    (commit,) = record["commits"]
    assert (commit["task_id"], commit["attempt_id"], commit["message"]) == ("ok", ok["id"], "Add the app")
    assert git("rev-list", f"{base}..HEAD", cwd=git_repo).split() == [commit["sha"]]
    assert files_of(git_repo, commit["sha"]) == ["src/app.py"]

    # each worker was given its share of the limit as Claude Code's own budget
    starts = [e for e in read_log(Path(env[LOG_ENV])) if e["event"] == "start"]
    assert len(starts) == 2
    for start in starts:
        assert start["argv"][start["argv"].index("--max-budget-usd") + 1] == "0.5000"
    transcript = git_repo / ".stella/private/transcripts" / record["run"]["id"] / "ok.jsonl"
    assert json.loads(transcript.read_text().splitlines()[-1])["type"] == "result"


def test_codex_under_a_spend_limit_without_a_price_stops_the_fleet_before_anything_runs(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = write_plan(
        tmp_path,
        [
            {"id": "priced", "prompt": "Write notes", "pipeline": "codex", "model": "gpt-5"},
            {"id": "house", "prompt": "Write more notes", "pipeline": "codex", "model": "house-codex-1"},
        ],
    )
    env = agent_env(tmp_path, {"turns": [{"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 1}]})
    proc = stella_main("--spend-limit", "1", "fleet", "--plan", str(plan), cwd=git_repo, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "pipeline codex: it has no budget flag of its own and no price known for model 'house-codex-1'"
        in (proc.stderr)
    )
    assert '[prices."house-codex-1"] with input_per_mtok = ... and output_per_mtok = ...' in proc.stderr
    assert "gpt-5" not in proc.stderr  # the priced model is fine
    assert not Path(env[LOG_ENV]).exists()  # no codex was started
    assert not (git_repo / ".stella" / "private" / "fleet.db").exists()  # and no run was recorded

    no_limit = stella_main("fleet", "--dry-run", "--plan", str(plan), cwd=git_repo, env=env)
    assert no_limit.returncode == 0, no_limit.stderr  # unpriced is allowed without a limit ($0 recorded)
    write_config(git_repo, extra='[prices."house-codex-1"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n')
    priced = stella_main(
        "--spend-limit", "1", "fleet", "--dry-run", "--plan", str(plan), cwd=git_repo, env=env
    )
    assert priced.returncode == 0, priced.stderr


def test_every_agent_cli_in_the_shared_tree_has_the_git_guard_and_an_isolated_one_the_real_git(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    shared = {"claude": "claude-code", "codex": "codex", "aider": "aider"}
    tasks = [{"id": cli, "prompt": "look around", "pipeline": pipeline} for cli, pipeline in shared.items()]
    plan = write_plan(tmp_path, [*tasks, {"id": "alone", "prompt": "look", "pipeline": "claude-code",
                                          "isolation": "isolated"}])  # fmt: skip
    env = agent_env(tmp_path, {})
    proc = stella_main("fleet", "--plan", str(plan), "--max-concurrency", "4", cwd=git_repo, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gits = {
        entry["task"]: entry["git"]
        for entry in read_log(tmp_path / "fake-agents.jsonl")
        if entry["event"] == "start"
    }
    guard = str(git_repo / ".stella" / "private" / "gitguard" / "git")
    assert gits == {"claude": guard, "codex": guard, "aider": guard, "alone": shutil.which("git")}
