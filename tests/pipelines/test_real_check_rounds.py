"""A check round goes on in the agent's own session, for the real Claude Code and Codex CLIs: the round's
first model request carries the first attempt's conversation, then the red check, and nothing of the task
again; each round's attempt says `resumed session ...` (the engine's: tests/run/test_sessions.py)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import by_id, run_record
from helpers.realclis import RUN_TIMEOUT_S, bash, codex_say, codex_shell, fleet_setup, say, write, write_plan
from helpers.repo import StellaRunner

from stellafleet.testing.model_server import ScriptedModelServer

RED = "and it is red"  # what a check round's prompt says


def test_claude_code_and_codex_check_rounds_go_on_in_their_sessions(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    cc = str(git_repo / "cc.txt")
    scripts = {
        "TASK-CC": [
            write(cc, "wrong\n"),
            bash("stella commit -m 'cc wrong' cc.txt"),
            say("Wrote cc.txt."),
            write(cc, "right\n"),
            bash("stella commit -m 'cc right' cc.txt"),
            say("Fixed cc.txt."),
        ],
        "TASK-CX": [
            codex_shell("printf 'wrong\\n' > cx.txt && stella commit -m 'cx wrong' cx.txt"),
            codex_say("Wrote cx.txt."),
            codex_shell("printf 'right\\n' > cx.txt && stella commit -m 'cx right' cx.txt"),
            codex_say("Fixed cx.txt."),
        ],
    }
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(git_repo, server, ["claude", "codex"])
        plan = write_plan(
            tmp_path,
            [
                {"id": "cc", "prompt": "TASK-CC: write cc.txt", "pipeline": "claude-code",
                 "check": "grep -qx right cc.txt", "check_rounds": 1, "claims": ["cc.txt"]},
                {"id": "cx", "prompt": "TASK-CX: write cx.txt", "pipeline": "codex",
                 "check": "grep -qx right cx.txt", "check_rounds": 1, "claims": ["cx.txt"]},
            ],
        )  # fmt: skip
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
        bodies = [json.dumps(r.body) for r in server.requests]
    record = run_record(git_repo)
    facts: dict[int, dict[str, object]] = {}
    for fact in record["facts"]:
        facts.setdefault(fact["attempt_id"], {})[fact["key"]] = fact["value"]
    for task, first_call in (("cc", "cc wrong"), ("cx", "cx wrong")):
        marker = f"TASK-{task.upper()}"
        first, second = (a for a in record["attempts"] if a["task_id"] == task)
        assert second["reason"] == "check" and second["outcome"] == "succeeded"
        session = facts[first["id"]]["session"]
        assert isinstance(session, dict)
        said = facts[second["id"]]["session_start"]
        assert isinstance(said, str) and said.startswith(f"resumed session {str(session['id'])[:8]}"), said
        round_start = next(body for body in bodies if marker in body and RED in body)
        # the earlier conversation (its first command), the red check after it, the task's words once
        assert first_call in round_start and round_start.index(first_call) < round_start.index(RED)
        assert round_start.count(f"{marker}: write") == 1
    assert {t["status"] for t in by_id(record["tasks"]).values()} == {"succeeded"}
