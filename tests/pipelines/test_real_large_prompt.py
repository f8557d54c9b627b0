"""A prompt larger than one command-line argument may be (128 KiB on Linux) reaches each real agent CLI
whole: Claude Code and Codex read it from stdin, aider from --message-file."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import by_id, run_record
from helpers.realclis import RUN_TIMEOUT_S, fleet_setup, say, write_plan
from helpers.repo import StellaRunner

from stellafleet.testing.model_server import ScriptedModelServer

ARG_MAX_ONE = 128 * 1024  # MAX_ARG_STRLEN: the most one argv string may hold


def big_prompt(key: str) -> str:
    lines = [f"{key}: line {n:06d} of the requirements" for n in range(6000)]
    return "\n".join([f"TASK-{key}", *lines, f"END-OF-{key}"])


def test_a_prompt_over_128_kib_reaches_claude_codex_and_aider_whole(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    prompts = {key: big_prompt(key) for key in ("CLAUDE", "CODEX", "AIDER")}
    assert all(len(prompt.encode()) > ARG_MAX_ONE for prompt in prompts.values())
    usage = {"input_tokens": 4000, "output_tokens": 9}
    scripts = {
        "TASK-CLAUDE": [say("Read the requirements.")],
        "TASK-CODEX": [{"text": "Read the requirements.", "usage": usage}],
        "TASK-AIDER": [{"text": "NOTES.md\n```\nread them all\n```\n", "usage": usage}],
    }
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(git_repo, server, ["claude", "codex", "aider"])
        plan = write_plan(
            tmp_path,
            [
                {"id": "claude", "prompt": prompts["CLAUDE"], "pipeline": "claude-code"},
                {"id": "codex", "prompt": prompts["CODEX"], "pipeline": "codex"},
                {"id": "aider", "prompt": prompts["AIDER"], "pipeline": "aider"},
            ],
        )
        proc = stella(
            "--spend-limit", "2", "fleet", "--plan", str(plan), "--max-concurrency", "3",
            cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0 and server.unknown == []
        bodies = [json.dumps(request.body) for request in server.requests]
    for key in prompts:
        asked = [body for body in bodies if f"TASK-{key}" in body]
        assert asked, f"no model call carried the {key} prompt"
        # the whole prompt: its last line and a line from its middle are in the model call
        assert all(f"END-OF-{key}" in body and f"{key}: line 003000 of" in body for body in asked), key
    attempts = by_id(run_record(git_repo)["attempts"], "task_id")
    assert {task: a["outcome"] for task, a in attempts.items()} == dict.fromkeys(
        ["claude", "codex", "aider"], "succeeded"
    ), {task: a["summary"] for task, a in attempts.items()}
