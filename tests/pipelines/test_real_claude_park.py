"""The real Claude Code CLI parks instead of being denied: a tool request outside the task's allow-list
goes to stella's permission server, the task parks (exit 5), and after `stella answer --allow`,
`stella fleet --resume` continues the same session (`claude --resume <id>`: the model server sees the
earlier conversation), where the tool call now goes through."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import by_id, run_record
from helpers.realclis import RUN_TIMEOUT_S, bash, fleet_setup, say, transcript, write_plan
from helpers.repo import StellaRunner

from stellafleet.testing.model_server import ScriptedModelServer

BUILD = "python3 -c \"open('built.txt', 'w').write('built')\""  # Bash, outside a shared task's allow-list


def test_claude_code_parks_on_a_permission_and_goes_on_in_its_session_once_allowed(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = {
        "TASK-PARK": [
            say("I will build it first.", tool_calls=[bash(BUILD)["tool_calls"][0]]),
            bash(BUILD),  # after the answer: the same request, now allowed
            bash("stella commit -m 'Build' built.txt"),
            say("Built and committed."),
        ]
    }
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        plan = write_plan(
            tmp_path, [{"id": "build", "prompt": "TASK-PARK: build it", "pipeline": "claude-code"}]
        )
        parked = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
        assert parked.returncode == 5, parked.stdout + parked.stderr
        asked = len(server.requests)
        first = run_record(git_repo)
        (attempt,) = first["attempts"]
        assert attempt["outcome"] == "parked" and not (git_repo / "built.txt").exists()
        (item,) = json.loads(stella("inbox", "--json", cwd=git_repo, env=env).stdout)["items"]
        assert item["parked"]["tool"] == "Bash" and item["parked"]["input"]["command"] == BUILD
        assert item["parked"]["last_words"] == "I will build it first."
        assert stella("answer", str(item["item"]), "--allow", cwd=git_repo, env=env).returncode == 0

        resumed = stella(
            "fleet", "--plan", str(plan), "--resume", first["run"]["id"], cwd=git_repo, env=env,
            timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        went_on = server.requests[asked].body
    assert (git_repo / "built.txt").exists()  # the call went through
    second = run_record(git_repo)
    (again,) = second["attempts"]
    assert again["outcome"] == "succeeded" and again["reason"] == "answer"
    facts = {f["key"]: f["value"] for f in second["facts"]}
    session = {f["key"]: f["value"] for f in first["facts"]}["session"]["id"]
    assert facts["resume"]["id"] == session and facts["session_start"].startswith(
        f"resumed session {session[:8]}"
    )
    init = next(m for m in transcript(git_repo, second["run"]["id"], "build") if m.get("subtype") == "init")
    assert init["session_id"] == session  # Claude Code went on in the same session
    said = json.dumps(went_on["messages"])
    assert "TASK-PARK" in said and json.dumps(BUILD)[1:-1] in said  # the earlier conversation
    assert "A person allowed Bash" in json.dumps(went_on["messages"][-1])  # then only the answer
    assert by_id(second["tasks"])["build"]["status"] == "succeeded"
