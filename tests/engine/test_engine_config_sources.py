"""The engine configured the README's ways: only by environment, only by .stella/config.toml, or both.

Each case runs the real command (`stella run`, `stella fleet "prompt"`, a plan with and without a task's own
`model`) as a process against the scripted model server, and checks which model every request named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import by_id, run_record
from helpers.repo import StellaRunner, git

from stellafleet.testing.model_server import ScriptedModelServer

SOURCES = ("env", "file", "both")
DEAD_URL = "http://127.0.0.1:9/v1"  # nothing listens there: a request sent to it fails the worker


def session(name: str) -> list[dict[str, Any]]:
    """A worker that writes NAME.txt, commits it through the lane and finishes."""
    usage = {"input_tokens": 100, "output_tokens": 10}
    return [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": f"{name}.txt", "content": f"{name}\n"}}]}
        | {"usage": usage},
        {"tool_calls": [{"name": "commit", "arguments": {"message": f"Add {name}.txt"}}], "usage": usage},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": f"added {name}"}}], "usage": usage},
    ]


def configure(source: str, root: Path, server: ScriptedModelServer) -> tuple[dict[str, str], str]:
    """The environment the command runs with, and the model its requests must name."""
    env = {"OPENAI_API_KEY": "sk-test-not-real"}
    if source in ("file", "both"):
        base_url = DEAD_URL if source == "both" else server.openai_base_url  # "both": the environment wins
        (root / ".stella").mkdir(exist_ok=True)
        (root / ".stella" / "config.toml").write_text(
            f'[engine]\nprovider = "openai"\nmodel = "file-model"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        )
    if source in ("env", "both"):
        env |= {"STELLA_PROVIDER": "openai", "STELLA_MODEL": "env-model"}
        env["STELLA_BASE_URL"] = server.openai_base_url
    return env, "file-model" if source == "file" else "env-model"


def models_asked(server: ScriptedModelServer) -> dict[str, set[str]]:
    """Each file a worker wrote -> the models its requests named (a worker's prompt names its file)."""
    asked: dict[str, set[str]] = {}
    for request in server.requests:
        text = json.dumps(request.body)
        for name in ("alpha", "beta"):
            if f"{name}.txt" in text:
                asked.setdefault(name, set()).add(request.body["model"])
    return asked


@pytest.mark.parametrize("source", SOURCES)
def test_stella_run(source: str, git_repo: Path, stella_main: StellaRunner) -> None:
    with ScriptedModelServer(session("alpha")) as server:
        env, model = configure(source, git_repo, server)
        result = stella_main("run", "Write alpha.txt", cwd=git_repo, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert {request.body["model"] for request in server.requests} == {model}
    assert git("log", "-1", "--format=%s", cwd=git_repo) == "Add alpha.txt\n"


@pytest.mark.parametrize("source", SOURCES)
def test_stella_fleet_with_inline_prompts(source: str, git_repo: Path, stella_main: StellaRunner) -> None:
    scripts = {"alpha.txt": session("alpha"), "beta.txt": session("beta")}
    with ScriptedModelServer([], scripts=scripts) as server:
        env, model = configure(source, git_repo, server)
        result = stella_main("fleet", "Write alpha.txt", "Write beta.txt", cwd=git_repo, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert models_asked(server) == {"alpha": {model}, "beta": {model}}
    tasks = by_id(run_record(git_repo)["tasks"])
    assert [tasks[t]["status"] for t in ("t1", "t2")] == ["succeeded", "succeeded"]


@pytest.mark.parametrize("source", SOURCES)
def test_a_plan_task_with_and_without_its_own_model(
    source: str, git_repo: Path, stella_main: StellaRunner, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "own"\nprompt = "Write alpha.txt"\nmodel = "task-model"\n\n'
        '[[tasks]]\nid = "configured"\nprompt = "Write beta.txt"\n'
    )
    scripts = {"alpha.txt": session("alpha"), "beta.txt": session("beta")}
    with ScriptedModelServer([], scripts=scripts) as server:
        env, model = configure(source, git_repo, server)
        result = stella_main("fleet", "--plan", str(plan), cwd=git_repo, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert models_asked(server) == {"alpha": {"task-model"}, "beta": {model}}
