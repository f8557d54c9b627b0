"""The aider pipeline against the real aider, through a real `stella fleet`.

aider (through litellm) asks the scripted model server on loopback for Chat Completions; the edit format,
its file writes and its cost accounting are the real program's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fleet import run_record
from helpers.realclis import RUN_TIMEOUT_S, fleet_setup, write_plan
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops
from stellafleet.testing.model_server import ScriptedModelServer

# aider's "whole" edit format: the file's path, then its whole new content in a fence.
WHOLE_EDIT = "I will write the greeting.\n\ngreeting.txt\n```\nhello from aider\n```\n"


def aider_costs(root: Path, run_id: str) -> list[float]:
    """The cost of each model call in aider's own analytics log for this run."""
    logs = list((StatePaths(root).private / "pipelines" / run_id).glob("*/aider-analytics.jsonl"))
    assert len(logs) == 1, logs
    events = [json.loads(line) for line in logs[0].read_text().splitlines() if line.strip()]
    return [float(e["properties"]["cost"]) for e in events if e["event"] == "message_send"]


def test_a_shared_aider_task_is_committed_with_only_its_files_and_its_own_cost(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "README.md").write_text("# test repository\nsomeone else's uncommitted edit\n")
    (git_repo / "other.txt").write_text("someone else's new file\n")
    steps = [{"text": WHOLE_EDIT, "usage": {"input_tokens": 1500, "output_tokens": 40}}]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["aider"])
        base = gitops.head_commit(git_repo)
        plan = write_plan(
            tmp_path,
            [
                {
                    "id": "greet",
                    "title": "Greet",
                    "prompt": "Create greeting.txt saying hello",
                    "pipeline": "aider",
                }
            ],
        )
        proc = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0 and server.unknown == []
        (request,) = server.requests
    assert request.wire == "openai" and request.body["model"] == "gpt-4o-mini"
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    (commit,) = record["commits"]
    assert attempt["outcome"] == "succeeded", attempt["summary"]
    assert attempt["summary"].startswith("aider edited greeting.txt in 1 model call(s)")
    assert git("rev-list", f"{base}..HEAD", cwd=git_repo).split() == [commit["sha"]]
    assert git("show", "--name-only", "--format=", commit["sha"], cwd=git_repo).split() == ["greeting.txt"]
    assert (commit["task_id"], commit["message"]) == ("greet", "Greet (aider)")
    assert (git_repo / "greeting.txt").read_text() == "hello from aider\n"
    # the others' work is still there, uncommitted
    assert "someone else's uncommitted edit" in (git_repo / "README.md").read_text()
    assert sorted(gitops.status_porcelain(git_repo)) == [" M README.md", "?? other.txt"]
    # the ledger's spend is aider's own accounting of its one call
    (cost,) = aider_costs(git_repo, record["run"]["id"])
    assert cost > 0
    assert attempt["spend_usd"] == pytest.approx(cost, abs=1e-12)
    assert (attempt["input_tokens"], attempt["output_tokens"], attempt["steps"]) == (1500, 40, 1)
