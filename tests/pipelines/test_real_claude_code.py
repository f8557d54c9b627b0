"""The claude-code pipeline against the real Claude Code CLI, through a real `stella fleet`.

Claude Code streams its model calls from the scripted model server on loopback; everything else (its
tools, its hooks, its cost table, its budget stop) is the real program's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.fleet import attempt_facts, by_id, run_record
from helpers.realclis import (
    RUN_TIMEOUT_S,
    bash,
    claude_results,
    fleet_setup,
    say,
    transcript,
    watched_spans,
    write,
    write_plan,
)
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops
from stellafleet.run.steps.unclaimed import EDGE_NS
from stellafleet.testing.model_server import ScriptedModelServer


def files_of(root: Path, sha: str) -> list[str]:
    return git("show", "--name-only", "--format=", sha, cwd=root).split()


def test_two_shared_tasks_write_edit_and_commit_through_stella_commit(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    # A project MCP server that would leave a mark if Claude Code ever started it.
    mark = tmp_path / "mcp-started"
    server_cmd = {"command": sys.executable, "args": ["-c", f"open({str(mark)!r}, 'w').close()"]}
    (git_repo / ".mcp.json").write_text(json.dumps({"mcpServers": {"marker": server_cmd}}))
    git("add", ".mcp.json", cwd=git_repo)
    git("commit", "-q", "-m", "project mcp server", cwd=git_repo)
    alpha, bravo = str(git_repo / "alpha.txt"), str(git_repo / "bravo.txt")
    scripts = {
        "TASK-ALPHA": [
            write(alpha, "alpha draft\n"),
            {
                "tool_calls": [
                    {
                        "name": "Edit",
                        "arguments": {"file_path": alpha, "old_string": "draft", "new_string": "final"},
                    }
                ],
                "usage": {"input_tokens": 2200, "output_tokens": 50},
            },
            bash("stella commit -m 'Add alpha' alpha.txt"),
            say("Added alpha.txt and committed it."),
        ],
        "TASK-BRAVO": [
            write(bravo, "bravo\n"),
            bash("stella commit -m 'Add bravo' bravo.txt"),
            say("Added bravo.txt and committed it."),
        ],
    }
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        base = gitops.head_commit(git_repo)
        plan = write_plan(
            tmp_path,
            [
                {"id": "alpha", "prompt": "TASK-ALPHA: write alpha.txt", "pipeline": "claude-code"},
                {"id": "bravo", "prompt": "TASK-BRAVO: write bravo.txt", "pipeline": "claude-code"},
            ],
        )
        proc = stella(
            "--spend-limit", "2", "fleet", "--plan", str(plan), "--max-concurrency", "2",
            cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0 and server.unknown == []

    record = run_record(git_repo)
    run_id = record["run"]["id"]
    attempts = by_id(record["attempts"], "task_id")
    commits = by_id(record["commits"], "task_id")
    assert git("rev-list", "--count", f"{base}..HEAD", cwd=git_repo).strip() == "2"
    for task, name, summary in (("alpha", "alpha.txt", "Added alpha"), ("bravo", "bravo.txt", "Added bravo")):
        attempt = attempts[task]
        assert attempt["outcome"] == "succeeded" and attempt["summary"].startswith(summary)
        assert files_of(git_repo, commits[task]["sha"]) == [name]
        assert commits[task]["attempt_id"] == attempt["id"]
        (result,) = claude_results(git_repo, run_id, task)
        assert result["subtype"] == "success" and result["total_cost_usd"] > 0
        # its session, as Claude Code named it, is a fact of the attempt (a follow-up may resume it)
        (session,) = attempt_facts(git_repo, attempt["id"]).values()
        assert session == {"id": result["session_id"], "cwd": str(git_repo), "tokens": session["tokens"]}
        assert session["tokens"] > 0  # its context after the last model call
        assert attempt["spend_usd"] == pytest.approx(result["total_cost_usd"], abs=1e-12)
        init = next(m for m in transcript(git_repo, run_id, task) if m.get("subtype") == "init")
        # stella's permission server is the only MCP server (not the project's), in acceptEdits mode
        assert [s["name"] for s in init["mcp_servers"]] == ["stella"] and init[
            "permissionMode"
        ] == "acceptEdits"
    assert (git_repo / "alpha.txt").read_text() == "alpha final\n"
    assert record["run"]["spend_usd"] == pytest.approx(sum(a["spend_usd"] for a in record["attempts"]))
    assert not mark.exists(), "Claude Code started the project's MCP server"
    # every model call streamed, as Claude Code asks
    assert all(r.streamed and r.wire == "anthropic" for r in server.requests)


def test_the_guard_reaches_claude_as_its_budget_and_its_budget_stop_is_recorded(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    target = str(git_repo / "loop.txt")
    # Each call costs a few cents; the script would go on calling tools far past the guard.
    steps = [write(target, f"round {i}\n", usage=(20_000, 200)) for i in range(12)]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        plan = write_plan(tmp_path, [{"id": "loop", "prompt": "keep going", "pipeline": "claude-code"}])
        proc = stella(
            "--spend-limit",
            "0.25",
            "fleet",
            "--plan",
            str(plan),
            cwd=git_repo,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
        # Claude Code checks its budget after a turn, so it passes it a little: the run says so, exit 3
        assert proc.returncode == 3, proc.stdout + proc.stderr
        served = len(server.requests)
    record = run_record(git_repo)
    assert record["run"]["status"] == "spend_limited"
    assert "recorded, over --spend-limit $0.25" in record["run"]["reason"]
    (attempt,) = record["attempts"]
    (result,) = claude_results(git_repo, record["run"]["id"], "loop")
    # Claude Code's own stop, at the budget stella handed it (--max-budget-usd 0.2500)
    assert (result["subtype"], result["terminal_reason"]) == ("error_max_budget_usd", "budget_exhausted")
    assert result["errors"] == ["Reached maximum budget ($0.25)"]
    assert result["total_cost_usd"] >= 0.25
    assert attempt["outcome"] == "failed"
    assert attempt["summary"].startswith("Claude Code stopped at its spend guard of $0.25")
    assert attempt["spend_usd"] == pytest.approx(result["total_cost_usd"], abs=1e-12)
    assert served == result["num_turns"] < len(steps)  # it stopped calling the model at its budget


def tool_uses(root: Path, run_id: str, task_id: str) -> dict[str, str]:
    """Claude Code's tool calls in a task's transcript: tool_use_id -> tool name."""
    return {
        block["id"]: block["name"]
        for m in transcript(root, run_id, task_id)
        if m.get("type") == "assistant"
        for block in m["message"]["content"]
        if block.get("type") == "tool_use"
    }


def test_the_claim_hook_run_by_claude_denies_a_file_another_task_holds(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    shared = str(git_repo / "shared.txt")
    scripts = {
        # holder: writes shared.txt (its hook claims it), then waits until the other task was refused
        "TASK-HOLDER": [
            write(shared, "the holder's\n"),
            bash("stella commit -m 'Holder writes shared.txt' shared.txt", after="is held by task"),
            say("Wrote shared.txt."),
        ],
        # intruder: edits shared.txt only once the holder has written it
        "TASK-INTRUDER": [
            write(shared, "the intruder's\n", after="File created successfully at: " + shared),
            say("Could not edit shared.txt: another task holds it."),
        ],
    }
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        plan = write_plan(
            tmp_path,
            [
                {"id": "holder", "title": "Holder", "prompt": "TASK-HOLDER", "pipeline": "claude-code"},
                {"id": "intruder", "title": "Intruder", "prompt": "TASK-INTRUDER", "pipeline": "claude-code"},
            ],
        )
        with watched_spans(git_repo) as spans:
            proc = stella(
                "fleet",
                "--plan",
                str(plan),
                "--max-concurrency",
                "2",
                cwd=git_repo,
                env=env,
                timeout=RUN_TIMEOUT_S,
            )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    run_id = record["run"]["id"]
    # Claude Code ran the hooks before and after each writing tool call (its Write, its Bash): the holder's
    # write spans, closed by PostToolUse, hold its write; the intruder's refused Write opened none
    attempts = by_id(record["attempts"], "task_id")
    holder, intruder = attempts["holder"]["id"], attempts["intruder"]["id"]
    calls = tool_uses(git_repo, run_id, "holder")
    assert sorted(calls.values()) == ["Bash", "Write"]
    written = (git_repo / "shared.txt").stat().st_mtime_ns
    ((start, end),) = [spans[holder, i] for i, name in calls.items() if name == "Write"]
    assert end is not None and start - EDGE_NS <= written <= end
    assert {(holder, i) for i, name in calls.items() if name == "Bash"} <= set(spans)
    assert not [span for span in spans if span[0] == intruder]
    (denied,) = [
        block
        for m in transcript(git_repo, run_id, "intruder")
        if m.get("type") == "user"
        for block in m["message"]["content"]
        if block.get("type") == "tool_result"
    ]
    assert denied["is_error"] is True
    assert "shared.txt is held by task" in denied["content"] and "holder" in denied["content"]
    (result,) = claude_results(git_repo, run_id, "intruder")
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Write"]
    assert "1 tool call(s) refused: Write " + shared in attempts["intruder"]["summary"]
    assert (git_repo / "shared.txt").read_text() == "the holder's\n"
    (commit,) = record["commits"]
    assert commit["task_id"] == "holder" and files_of(git_repo, commit["sha"]) == ["shared.txt"]


def test_an_isolated_claude_task_commits_with_git_on_its_fleet_branch(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    # the worktree's path is made by the fleet, so the steps name the file relative to Claude's cwd
    steps = [
        write("solo.txt", "solo\n"),
        bash("git add solo.txt && git commit -q -m 'Add solo.txt'"),
        say("Committed solo.txt."),
    ]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        base = gitops.head_commit(git_repo)
        plan = write_plan(
            tmp_path,
            [{"id": "solo", "prompt": "TASK-SOLO", "pipeline": "claude-code", "isolation": "isolated"}],
        )
        proc = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    (commit,) = record["commits"]
    assert attempt["outcome"] == "succeeded" and attempt["summary"] == "Committed solo.txt."
    assert commit["branch"].startswith("fleet/solo-")
    assert git("rev-list", f"{base}..{commit['branch']}", cwd=git_repo).split() == [commit["sha"]]
    assert files_of(git_repo, commit["sha"]) == ["solo.txt"]
    (result,) = claude_results(git_repo, record["run"]["id"], "solo")
    assert result["permission_denials"] == []
