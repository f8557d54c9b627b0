"""The real agent CLIs (installed by `python3 tools/dev.py agents`) for the end-to-end pipeline tests.

A test that needs one calls `real_cli(name)`: locally it skips with the reason when the CLI is missing,
under CI=true it fails instead. `fleet_setup` writes the config that points each pipeline at its real
binary and returns the environment that points each CLI at the scripted model server on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers.needs import missing
from helpers.repo import git
from stellafleet.core.paths import StatePaths
from stellafleet.testing.model_server import ScriptedModelServer

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(os.environ.get("STELLA_AGENTS_DIR") or ROOT / ".agents")
INSTALLED = {
    "claude": AGENTS / "node_modules" / ".bin" / "claude",
    "codex": AGENTS / "node_modules" / ".bin" / "codex",
    "aider": AGENTS / "aider" / "bin" / "aider",
}
PIPELINES = {"claude": "claude-code", "codex": "codex", "aider": "aider"}
# Models the CLIs know prices for (Claude Code and aider price their own calls; stella prices Codex's).
CODEX_MODEL = "gpt-5"
AIDER_MODEL = "openai/gpt-4o-mini"
RUN_TIMEOUT_S = 420.0  # a whole `stella fleet` of real CLIs on a loaded two-core machine


def real_cli(name: str) -> str:
    """The real CLI's path; skips (or fails under CI=true) with the reason when it is not installed."""
    path = INSTALLED[name]
    found = (
        str(path) if path.exists() else shutil.which(name, path=os.environ.get("STELLA_REAL_CLI_PATH", ""))
    )
    if found:
        return found
    reason = f"the real {name} CLI is not installed at {path}: run `python3 tools/dev.py agents`"
    missing(reason)


def write_plan(tmp_path: Path, tasks: Sequence[Mapping[str, Any]]) -> Path:
    lines: list[str] = []
    for task in tasks:
        lines.append("[[tasks]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in task.items()]
        lines.append("")
    path = tmp_path / "plan.toml"
    path.write_text("\n".join(lines))
    return path


def fleet_setup(
    root: Path, server: ScriptedModelServer, clis: Sequence[str], *, extra_config: str = ""
) -> dict[str, str]:
    """Config naming each real binary (committed, so the tree starts clean); the CLIs' environment."""
    lines: list[str] = []
    for name in clis:
        lines += [f"[pipelines.{PIPELINES[name]}]", f"binary = {json.dumps(real_cli(name))}"]
        if name == "codex":
            url = server.openai_base_url
            provider = f'{{name="local", base_url="{url}", wire_api="responses", env_key="LOCAL_MODEL_KEY"}}'
            args = ["-c", "model_provider=local", "-c", f"model_providers.local={provider}"]
            lines += [f"model = {json.dumps(CODEX_MODEL)}", f"extra_args = {json.dumps(args)}"]
        if name == "aider":
            lines += [
                f"model = {json.dumps(AIDER_MODEL)}",
                'extra_args = ["--edit-format", "whole", "--map-tokens", "0"]',
            ]
        lines.append("")
    config = StatePaths(root).config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join(lines) + "\n" + extra_config)
    git("add", str(config), cwd=root)
    git("commit", "-q", "-m", "stella config", cwd=root)
    return {
        "ANTHROPIC_BASE_URL": server.anthropic_base_url,
        "ANTHROPIC_API_KEY": "sk-ant-local-test",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "LOCAL_MODEL_KEY": "sk-local-test",
        "OPENAI_API_BASE": server.openai_base_url,
        "OPENAI_API_KEY": "sk-local-test",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def claude_results(root: Path, run_id: str, task_id: str) -> list[dict[str, Any]]:
    """The `result` messages in a Claude Code task's transcript (its own report of cost and outcome)."""
    return [m for m in transcript(root, run_id, task_id) if m.get("type") == "result"]


def transcript(root: Path, run_id: str, task_id: str) -> list[dict[str, Any]]:
    path = StatePaths(root).private / "transcripts" / run_id / f"{task_id}.jsonl"
    messages = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            messages.append(json.loads(line))
    return messages


def write(path: str, content: str, usage: tuple[int, int] = (2000, 60), **step: Any) -> dict[str, Any]:
    """A Claude Code step calling its Write tool."""
    call = {"name": "Write", "arguments": {"file_path": path, "content": content}}
    return {"tool_calls": [call], "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}, **step}


def bash(command: str, usage: tuple[int, int] = (2500, 40), **step: Any) -> dict[str, Any]:
    """A Claude Code step calling its Bash tool."""
    call = {"name": "Bash", "arguments": {"command": command, "description": "run it"}}
    return {"tool_calls": [call], "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}, **step}


def say(text: str, usage: tuple[int, int] = (3000, 30), **step: Any) -> dict[str, Any]:
    return {"text": text, "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}, **step}


def codex_shell(cmd: str, tokens: tuple[int, int] = (3000, 80), **step: Any) -> dict[str, Any]:
    """A Codex step running a command through its exec_command tool."""
    call = {"name": "exec_command", "arguments": {"cmd": cmd}}
    return {"tool_calls": [call], "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}, **step}


def codex_say(text: str, tokens: tuple[int, int] = (4000, 20)) -> dict[str, Any]:
    return {"text": text, "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}


@contextlib.contextmanager
def watched_spans(root: Path) -> Iterator[dict[tuple[int, str], tuple[int, int | None]]]:
    """The write spans the store held while the body ran (they are dropped as each attempt is released),
    by attempt and the span's name (Claude Code's tool_use_id, `codex-` and Codex's item id), as last seen."""
    seen: dict[tuple[int, str], tuple[int, int | None]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.03):
            with contextlib.suppress(sqlite3.Error):
                conn = sqlite3.connect(f"file:{StatePaths(root).store_db}?mode=ro", uri=True)
                try:
                    rows = conn.execute("SELECT attempt_id, span, start_ns, end_ns FROM write_spans")
                    for attempt, span, start, end in rows:
                        seen[attempt, span] = (start, end)
                finally:
                    conn.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
