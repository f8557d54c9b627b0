"""An engine fleet against the scripted model server: its config, a plan of marked tasks, their scripts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.testing.model_server import ScriptedModelServer

PRICED = '[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n'


def session(task: str, reads: int = 2) -> list[dict[str, Any]]:
    """One task's model session: a few reads, then finish."""
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]}
    steps = [{**read, "usage": {"input_tokens": 1000, "output_tokens": 20}} for _ in range(reads)]
    finish = {"name": "finish", "arguments": {"summary": f"{task} done"}}
    return [*steps, {"tool_calls": [finish], "usage": {"input_tokens": 1100, "output_tokens": 10}}]


def plan(root: Path, ids: list[str], extra: str = "") -> Path:
    path = root / "plan.toml"
    path.write_text(
        "".join(f'[[tasks]]\nid = "{i}"\nprompt = "marker-{i}: read the README"\n{extra}\n' for i in ids)
    )
    return path


def configure(root: Path, server: ScriptedModelServer, *, retries: int = 6, fleet: str = "") -> None:
    (root / ".stella").mkdir(exist_ok=True)
    (root / ".stella/config.toml").write_text(
        f'[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n'
        f"max_retries = {retries}\n{PRICED}\n[fleet]\n{fleet}\n"
    )


def scripts(ids: list[str], reads: int = 2) -> dict[str, list[dict[str, Any]]]:
    return {f"marker-{i}:": session(i, reads) for i in ids}
