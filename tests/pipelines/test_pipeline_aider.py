"""The aider pipeline against a fake `aider --message`: cost from its analytics log, commits, every ending.

The real aider is run in test_real_aider.py. The fake stays for what the real one cannot be made to do on
demand: crash, hang, write a malformed analytics log, exit without a model call, or report exact costs
across several calls.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.agents import RUN_ID, FakeAgents, RecordingSpend, run_pipeline
from helpers.repo import git

from stellafleet.pipelines.aider import AiderPipeline
from stellafleet.pipelines.base import PipelineResult
from stellafleet.state.claims import ClaimStore, Holder


def run(
    root: Path, cfg: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[RecordingSpend, PipelineResult]:
    return run_pipeline(AiderPipeline(), root, cfg, **ctx_args)


def test_success_reports_each_calls_cost_and_commits_the_edited_files(
    git_repo: Path, fakes: FakeAgents
) -> None:
    (git_repo / "unrelated.txt").write_text("someone else's uncommitted work\n")
    fakes.script(
        {
            "edits": [{"path": "src/notes.py", "content": "NOTES = 1\n"}],
            "calls": [
                {"prompt_tokens": 2400, "completion_tokens": 350, "cost": 0.0113},
                {"prompt_tokens": 3100, "completion_tokens": 120, "cost": 0.0095},
            ],
        }
    )
    spend, result = run(git_repo, guard=1.0, model="gpt-4o")
    assert result.success, result.summary
    assert result.summary.startswith("aider edited src/notes.py in 2 model call(s) ($0.0208); committed ")
    assert [round(call["usd"], 6) for call in spend.calls] == [0.0113, 0.0095]
    assert (spend.total("input_tokens"), spend.total("output_tokens"), spend.total("steps")) == (5500, 470, 2)
    assert result.spend_usd == pytest.approx(0.0208)
    # exactly the edited file was committed, recorded for this attempt; the other change is untouched
    assert git("show", "--name-only", "--format=%s", "HEAD", cwd=git_repo).split() == [
        "Write",
        "the",
        "notes",
        "(aider)",
        "src/notes.py",
    ]
    assert "?? unrelated.txt" in git("status", "--porcelain", cwd=git_repo)
    with sqlite3.connect(git_repo / ".stella/private/fleet.db") as db:
        recorded = db.execute("SELECT sha, task_id, attempt_id FROM commits").fetchall()
    assert recorded == [(git("rev-parse", "HEAD", cwd=git_repo).strip(), "t1", 1)]
    argv = fakes.argv("aider")
    # the prompt comes in a file (one argument holds at most 128 KiB), and nothing else is in it
    assert argv[0] == "--message-file" and "--message" not in argv
    assert fakes.prompt("aider") == "Write notes.txt"
    for flag in (
        "--yes-always",
        "--no-auto-commits",
        "--no-dirty-commits",
        "--no-gitignore",
        "--no-analytics",
    ):
        assert flag in argv
    assert argv[argv.index("--model") + 1] == "gpt-4o"
    assert ".stella/private/pipelines/" in argv[argv.index("--analytics-log") + 1]


def test_edits_to_a_file_another_task_holds_are_not_committed(git_repo: Path, fakes: FakeAgents) -> None:
    import os

    holder = Holder.current(RUN_ID, "schema", "Add the migration", 9, pid=os.getpid())
    with ClaimStore.open(git_repo / ".stella/private/store.db") as store:
        store.acquire(["schema.sql"], holder)
    fakes.script({"edits": [{"path": "schema.sql", "content": "create table x;\n"}]})
    _spend, result = run(git_repo)
    assert not result.success
    assert (
        'not committed: claim conflict: schema.sql is held by task "schema" (Add the migration)'
        in result.summary
    )
    assert (git_repo / "schema.sql").exists()  # left in place for the user to see
    assert git("log", "--format=%s", cwd=git_repo).splitlines() == ["initial commit"]


def test_no_edits_means_no_commit(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"calls": [{"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.001}]})
    _spend, result = run(git_repo)
    assert result.success
    assert result.summary == "aider answered without editing files in 1 model call(s) ($0.001)"


def test_error_without_a_model_call_fails_with_what_aider_said(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "error", "reply": "litellm.AuthenticationError: invalid api key"})
    spend, result = run(git_repo)
    assert not result.success
    assert result.summary.startswith("aider made no model call: ")
    assert "litellm.AuthenticationError: invalid api key" in result.summary
    assert spend.calls == []


def test_malformed_analytics_log(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "malformed"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary.startswith("could not parse aider output: its analytics log has a line that is not")


def test_crash(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "crash", "stderr": "RuntimeError: fake aider crashed"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary == (
        "aider ended (exit status 1) before reporting a result: RuntimeError: fake aider crashed"
    )


def test_hang_past_the_task_timeout(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "hang"})
    _spend, result = run(git_repo, timeout=3.0)
    assert not result.success
    stopped = "aider did not finish within the task timeout of 3s and was stopped"
    assert result.summary == f"{stopped} ($0.00 spent)"
    assert fakes.log("terminated", "aider")


def test_guard_stops_aider_between_calls(git_repo: Path, fakes: FakeAgents) -> None:
    calls = [{"prompt_tokens": 1000, "completion_tokens": 100, "cost": 0.04} for _ in range(5)]
    fakes.script({"calls": calls, "pause_s": 1.5, "edits": [{"path": "a.txt", "content": "x"}]})
    started = time.monotonic()
    spend, result = run(git_repo, guard=0.07)
    assert not result.success
    assert result.summary == (
        "aider was stopped: spend guard of $0.07 reached ($0.08 by its own cost report); "
        "its edits were left uncommitted"
    )
    assert [entry["index"] for entry in fakes.log("message_send", "aider")] == [0, 1]
    assert fakes.log("terminated", "aider")
    assert time.monotonic() - started < 1.5 * 2 + 1.5
    assert spend.usd == pytest.approx(0.08)


def test_a_follow_up_restores_the_tasks_chat_history_and_sends_only_what_is_new(
    git_repo: Path, fakes: FakeAgents, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = git_repo / ".stella/private/pipelines" / RUN_ID / "t1-aider-chat.md"  # an earlier run's
    history.parent.mkdir(parents=True)
    history.write_text("# aider chat started\n\n#### Write the notes\n")
    resume = {"id": str(history), "cwd": str(git_repo), "tokens": 900, "prompt": "the check is red: fix it"}
    monkeypatch.setenv("STELLA_FACTS", json.dumps({"resume": resume}))
    fakes.script({"calls": [{"prompt_tokens": 1000, "completion_tokens": 50, "cost": 0.001}]})
    _spend, result = run(git_repo)
    argv = fakes.argv("aider")
    assert argv[argv.index("--chat-history-file") + 1] == str(history) and "--restore-chat-history" in argv
    assert fakes.prompt("aider") == "the check is red: fix it"  # what is new, not the task again
    assert result.facts["session"] == {"id": str(history), "cwd": str(git_repo), "tokens": 1050}
