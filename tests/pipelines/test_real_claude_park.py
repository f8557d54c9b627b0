"""The issue's plan, done: the real Claude Code CLI parks instead of being denied (a tool request outside
its allow-list goes to stella's permission server) and an engine task asks a question; the run ends with
exit 5 and two inbox items, `[notify]` hears each park once, both are answered, and `stella fleet
--resume` finishes both in their own sessions (`claude --resume <id>`: the model server sees the earlier
conversation and the tool call now goes through; the engine's conversation comes back from its
transcript)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.fleet import by_id, run_record
from helpers.realclis import RUN_TIMEOUT_S, bash, fleet_setup, say, transcript, write_plan
from helpers.repo import StellaRunner, git

from stellafleet.testing.model_server import ScriptedModelServer

BUILD = "python3 -c \"open('built.txt', 'w').write('built')\""  # Bash, outside the task's allow-list
QUESTION = "Which name should the module have?"
ENGINE = (
    '[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{url}"\n'
    '[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n'
    "[notify]\ncommand = {notify}\n"
)


def engine_call(name: str, **arguments: str) -> dict[str, Any]:
    call = {"name": name, "arguments": arguments}
    return {"tool_calls": [call], "usage": {"input_tokens": 900, "output_tokens": 9}}


def facts_of(record: dict[str, Any], attempt_id: int) -> dict[str, Any]:
    return {f["key"]: f["value"] for f in record["facts"] if f["attempt_id"] == attempt_id}


def test_a_permission_and_a_question_park_and_both_go_on_in_their_sessions_once_answered(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = {
        "TASK-PARK": [
            say("I will build it first.", tool_calls=[bash(BUILD)["tool_calls"][0]]),
            bash(BUILD),  # after the answer: the same request, now allowed
            bash("stella commit -m 'Build' built.txt"),
            say("Built and committed."),
        ],
        "TASK-ASK": [engine_call("ask", question=QUESTION), engine_call("finish", summary="Named it.")],
    }
    heard = tmp_path / "heard.jsonl"
    with ScriptedModelServer([], scripts=scripts) as server:
        notify = json.dumps(f"cat >> {heard}; echo >> {heard}")
        extra = ENGINE.format(url=server.openai_base_url, notify=notify)
        env = fleet_setup(git_repo, server, ["claude"], extra_config=extra)
        plan = write_plan(
            tmp_path,
            [
                # isolated: `--resume` gives it a new worktree, where its session must be found
                {
                    "id": "build",
                    "prompt": "TASK-PARK: build it",
                    "pipeline": "claude-code",
                    "isolation": "isolated",
                },
                {"id": "name", "prompt": "TASK-ASK: name the module", "pipeline": "plain"},
            ],
        )
        parked = stella(
            "fleet",
            "--plan",
            str(plan),
            "--max-concurrency",
            "2",
            cwd=git_repo,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
        assert parked.returncode == 5, parked.stdout + parked.stderr
        assert "parked: 2 tasks wait on you" in parked.stderr
        asked = len(server.requests)
        first = run_record(git_repo)
        assert {a["outcome"] for a in first["attempts"]} == {"parked"}
        # Claude Code's turn was interrupted, not killed: it reported what it spent
        assert by_id(first["attempts"], "task_id")["build"]["spend_usd"] > 0
        worktree = by_id(first["attempts"], "task_id")["build"]["worktree"]
        assert not (Path(worktree) / "built.txt").exists()
        items = json.loads(stella("inbox", "--json", cwd=git_repo, env=env).stdout)["items"]
        tool, question = sorted(items, key=lambda found: found["task_id"])  # build, name
        assert tool["parked"]["tool"] == "Bash" and tool["parked"]["input"]["command"] == BUILD
        assert tool["parked"]["last_words"] == "I will build it first."
        assert question["parked"]["question"] == QUESTION
        events = [json.loads(line) for line in heard.read_text().splitlines() if line.strip()]
        told = sorted(event["item"] for event in events if event["event"] == "parked")
        assert told == sorted([tool["item"], question["item"]])  # each park heard once
        assert stella("answer", str(tool["item"]), "--allow", cwd=git_repo, env=env).returncode == 0
        assert (
            stella("answer", str(question["item"]), "call it stellar", cwd=git_repo, env=env).returncode == 0
        )

        resumed = stella(
            "fleet", "--plan", str(plan), "--resume", first["run"]["id"], cwd=git_repo, env=env,
            timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        bodies = [r.body for r in server.requests[asked:]]
        shown = stella("runs", "latest", cwd=git_repo, env=env).stdout
    second = run_record(git_repo)
    (commit,) = second["commits"]
    assert git("show", "--name-only", "--format=", commit["sha"], cwd=git_repo).split() == ["built.txt"]
    assert {(a["task_id"], a["outcome"], a["reason"]) for a in second["attempts"]} == {
        ("build", "succeeded", "answer"),
        ("name", "succeeded", "answer"),
    }
    assert {t["status"] for t in second["tasks"]} == {"succeeded"}
    assert shown.count("session: resumed session") == 2, shown  # each in its own session

    built = by_id(second["attempts"], "task_id")["build"]
    session = facts_of(first, by_id(first["attempts"], "task_id")["build"]["id"])["session"]["id"]
    assert facts_of(second, built["id"])["resume"]["id"] == session
    init = next(m for m in transcript(git_repo, second["run"]["id"], "build") if m.get("subtype") == "init")
    assert init["session_id"] == session  # Claude Code went on in the same session
    went_on = next(body for body in bodies if "TASK-PARK" in json.dumps(body))
    said = json.dumps(went_on["messages"])
    assert "TASK-PARK" in said and json.dumps(BUILD)[1:-1] in said  # the earlier conversation
    last_user = [m for m in went_on["messages"] if m["role"] == "user"][-1]
    assert "A person allowed Bash" in json.dumps(last_user)  # then only the answer
    answered = next(body for body in bodies if "call it stellar" in json.dumps(body))
    assert QUESTION in json.dumps(answered) and "call it stellar" in json.dumps(answered["messages"][-1])
