"""Agent-CLI pipelines through a real `stella fleet`: worker processes, the ledger, commits, mixed plans."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import Scripts, by_id, file_locks, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.config import Config
from stellafleet.core.pricing import TokenUsage, price_for
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
    git_repo: Path, tmp_path: Path, stella: StellaRunner
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
    proc = stella(
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


FORMATTER = """\
app = WS / "src" / "app.py"
lines = [" ".join(line.split()) for line in app.read_text().splitlines()]
app.write_text("\\n".join(lines) + "\\n")
sha = stella_commit("Format src/app.py", "src/app.py")
report(summary=f"formatted src/app.py in {sha[:12]}")
"""


def test_a_plan_mixing_pipelines_runs_each_task_through_its_own(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    write_config(git_repo, run=scripts.python("fmt", FORMATTER))
    git("add", ".stella/config.toml", cwd=git_repo)
    git("commit", "-q", "-m", "stella config", cwd=git_repo)
    base = gitops.head_commit(git_repo)
    script = {
        "tasks": {
            "draft": {
                "edits": [{"path": "src/app.py", "content": "x   =   1\ny =    2\n"}],
                "commit": {"message": "Draft the app"},
                "cost": 0.02,
            },
            "notes": {
                "edits": [{"path": "NOTES.md", "content": "the app sets x and y\n"}],
                "commit": {"message": "Write the notes"},
                "message": "Wrote NOTES.md.",
            },
            "docs": {"edits": [{"path": "docs/app.md", "content": "# app\n"}]},
            "review": {
                "edits": [{"path": "REVIEW.md", "content": "looks fine\n"}],
                "commit": {"message": "Review"},
                "cost": 0.01,
            },
        }
    }
    plan = write_plan(
        tmp_path,
        [
            {"id": "draft", "prompt": "Draft src/app.py", "pipeline": "claude-code"},
            {"id": "format", "prompt": "Format the code", "pipeline": "command", "depends_on": ["draft"]},
            {
                "id": "notes",
                "prompt": "Write notes",
                "pipeline": "codex",
                "model": "gpt-5",
                "depends_on": ["format"],
            },
            {"id": "docs", "prompt": "Document the app", "pipeline": "aider", "depends_on": ["format"]},
            {
                "id": "review",
                "prompt": "Review it all",
                "pipeline": "claude-code",
                "depends_on": ["notes", "docs"],
            },
        ],
    )
    env = agent_env(tmp_path, script)
    proc = stella(
        "--spend-limit", "2", "fleet", "--plan", str(plan), "--max-concurrency", "2", cwd=git_repo, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert {task_id: task["status"] for task_id, task in tasks.items()} == dict.fromkeys(
        ["draft", "format", "notes", "docs", "review"], "succeeded"
    )
    assert [tasks[t]["wave"] for t in ("draft", "format", "notes", "docs", "review")] == [1, 2, 3, 3, 4]
    attempts = by_id(record["attempts"], "task_id")
    assert {t: a["pipeline"] for t, a in attempts.items()} == {
        "draft": "claude-code",
        "format": "command",
        "notes": "codex",
        "docs": "aider",
        "review": "claude-code",
    }
    assert (git_repo / "src/app.py").read_text() == "x = 1\ny = 2\n"  # the formatter ran after the draft
    pricer = price_for("gpt-5", Config({}))
    assert pricer is not None
    codex_usd = pricer.cost(TokenUsage(input_tokens=20000, output_tokens=800, cache_read_tokens=5000))
    assert attempts["notes"]["spend_usd"] == pytest.approx(codex_usd)
    assert attempts["notes"]["summary"] == "Wrote NOTES.md."
    assert attempts["docs"]["summary"].startswith(
        "aider edited docs/app.md in 1 model call(s) ($0.0113); committed "
    )
    assert record["run"]["spend_usd"] == pytest.approx(0.02 + codex_usd + 0.0113 + 0.01)

    # history: one commit per task, in dependency order, each holding only its own files
    commits = by_id(record["commits"], "sha")
    history = git("rev-list", "--reverse", f"{base}..HEAD", cwd=git_repo).split()
    order = [commits[sha]["task_id"] for sha in history]
    assert (
        order[:2] == ["draft", "format"] and sorted(order[2:4]) == ["docs", "notes"] and order[4] == "review"
    )
    expected_files = {
        "draft": ["src/app.py"],
        "format": ["src/app.py"],
        "notes": ["NOTES.md"],
        "docs": ["docs/app.md"],
        "review": ["REVIEW.md"],
    }
    for sha in history:
        assert files_of(git_repo, sha) == expected_files[commits[sha]["task_id"]]
    assert git("status", "--porcelain", cwd=git_repo) == ""


def test_concurrent_claude_workers_cannot_edit_the_same_file(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    edited, refused = tmp_path / "first-edited", tmp_path / "second-refused"
    script = {
        "tasks": {
            "first": {
                "edits": [{"path": "shared.txt", "content": "first\n"}],
                "mark": str(edited),
                "wait_after": str(refused),  # hold the claim until the other worker has tried
                "commit": {"message": "first writes shared.txt"},
            },
            "second": {
                "wait_for": str(edited),
                "edits": [
                    {"path": "shared.txt", "content": "second\n"},
                    {"path": "own.txt", "content": "mine\n"},
                ],
                "mark": str(refused),
                "commit": {"message": "second writes own.txt"},
            },
        }
    }
    plan = write_plan(
        tmp_path,
        [
            {
                "id": "first",
                "title": "Hold the file",
                "prompt": "Write shared.txt",
                "pipeline": "claude-code",
            },
            {
                "id": "second",
                "title": "Try the file",
                "prompt": "Write shared.txt too",
                "pipeline": "claude-code",
            },
        ],
    )
    env = agent_env(tmp_path, script)
    proc = stella("fleet", "--plan", str(plan), "--max-concurrency", "2", cwd=git_repo, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    record = run_record(git_repo)
    assert [task["wave"] for task in record["tasks"]] == [1, 1]
    attempts = by_id(record["attempts"], "task_id")
    (denied,) = [e for e in read_log(Path(env[LOG_ENV])) if e["event"] == "denied"]
    assert (denied["task"], denied["path"]) == ("second", "shared.txt")
    assert denied["reason"].startswith(
        f'claim conflict: shared.txt is held by task "first" (Hold the file) '
        f"(run {record['run']['id']}, pid {attempts['first']['pid']})"
    )
    assert (git_repo / "shared.txt").read_text() == "first\n"
    assert "1 tool call(s) refused: Write " in attempts["second"]["summary"]
    commits = {c["task_id"]: c for c in record["commits"]}
    assert files_of(git_repo, commits["first"]["sha"]) == ["shared.txt"]
    assert files_of(git_repo, commits["second"]["sha"]) == ["own.txt"]
    assert file_locks(git_repo) == []  # implicit claims end with their attempts


def test_codex_under_a_spend_limit_without_a_price_stops_the_fleet_before_anything_runs(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = write_plan(
        tmp_path,
        [
            {"id": "priced", "prompt": "Write notes", "pipeline": "codex", "model": "gpt-5"},
            {"id": "house", "prompt": "Write more notes", "pipeline": "codex", "model": "house-codex-1"},
        ],
    )
    env = agent_env(tmp_path, {"turns": [{"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 1}]})
    proc = stella("--spend-limit", "1", "fleet", "--plan", str(plan), cwd=git_repo, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "pipeline codex: it has no budget flag of its own and no price known for model 'house-codex-1'"
        in (proc.stderr)
    )
    assert '[prices."house-codex-1"] with input_per_mtok = ... and output_per_mtok = ...' in proc.stderr
    assert "gpt-5" not in proc.stderr  # the priced model is fine
    assert not Path(env[LOG_ENV]).exists()  # no codex was started
    assert not (git_repo / ".stella" / "private" / "fleet.db").exists()  # and no run was recorded

    no_limit = stella("fleet", "--dry-run", "--plan", str(plan), cwd=git_repo, env=env)
    assert no_limit.returncode == 0, no_limit.stderr  # unpriced is allowed without a limit ($0 recorded)
    write_config(git_repo, extra='[prices."house-codex-1"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n')
    priced = stella("--spend-limit", "1", "fleet", "--dry-run", "--plan", str(plan), cwd=git_repo, env=env)
    assert priced.returncode == 0, priced.stderr
