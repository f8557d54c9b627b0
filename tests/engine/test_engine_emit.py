"""The engine's emit_tasks tool: an expanding task's model writes its plan fragment, through a real fleet
run against the scripted model server."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from helpers.engine import make_repo

from stellafleet.cli import main
from stellafleet.engine.errors import ToolFailure
from stellafleet.engine.tools import Toolbox, Workspace
from stellafleet.testing.model_server import ScriptedModelServer

PLAN = """\
[[tasks]]
id = "split"
prompt = "SPLIT-MARK: emit one task per module"
expands = true

[[tasks]]
id = "integrate"
prompt = "INTEGRATE-MARK: bring it together"
depends_on = ["split"]
"""

FRAGMENT = """\
[[tasks]]
id = "alpha"
prompt = "ALPHA-MARK: the first module"

[[tasks]]
id = "beta"
prompt = "BETA-MARK: the second module"
depends_on = ["alpha"]
"""


def finish(summary: str) -> list[dict]:
    return [{"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}]


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("STELLA_SPEND_LIMIT", "STELLA_MODEL", "STELLA_BASE_URL", "STELLA_PROVIDER", "STELLA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return root


def test_the_engine_emits_tasks_with_its_tool_and_the_fleet_runs_them(repo: Path, tmp_path: Path) -> None:
    scripts = {  # the first key found in a request's body picks its script: the emitter's comes first
        "SPLIT-MARK": [
            {"tool_calls": [{"name": "emit_tasks", "arguments": {"fragment": FRAGMENT}}]},
            *finish("Emitted two module tasks."),
        ],
        "ALPHA-MARK": finish("alpha done"),
        "BETA-MARK": finish("beta done"),
        "INTEGRATE-MARK": finish("integrated"),
    }
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    with ScriptedModelServer([], scripts=scripts) as server:
        (repo / ".stella").mkdir(exist_ok=True)
        (repo / ".stella/config.toml").write_text(
            f'[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n'
            "max_retries = 0\n"
        )
        code = main(["fleet", "--plan", str(plan), "--max-concurrency", "1"])
        bodies = [request.body for request in server.requests]
    assert code == 0
    # only the expanding task's model is offered the tool (a task's prompt opens its conversation)
    offered = {
        marker: any(
            marker in json.dumps(body["messages"][:2])
            and "emit_tasks" in [t["function"]["name"] for t in body["tools"]]
            for body in bodies
        )
        for marker in ("SPLIT-MARK", "ALPHA-MARK", "INTEGRATE-MARK")
    }
    assert offered == {"SPLIT-MARK": True, "ALPHA-MARK": False, "INTEGRATE-MARK": False}
    conn = sqlite3.connect(repo / ".stella/private/fleet.db")
    conn.row_factory = sqlite3.Row
    rows = {row["id"]: row for row in conn.execute("SELECT * FROM tasks")}
    order = [row[0] for row in conn.execute("SELECT task_id FROM attempts ORDER BY started_at_ms, id")]
    summaries = dict(conn.execute("SELECT task_id, summary FROM attempts").fetchall())
    conn.close()
    assert order == ["split", "split.alpha", "split.beta", "integrate"]
    assert rows["split.beta"]["parent_id"] == "split"
    assert json.loads(rows["split.beta"]["depends_on_json"]) == ["split.alpha"]
    assert Path(rows["split"]["fragment_path"]).read_text() == FRAGMENT
    assert summaries["split"] == "Emitted two module tasks. (emitted 2 tasks)"
    assert all(row["status"] == "succeeded" for row in rows.values())


def test_the_tool_refuses_what_is_not_a_fragment_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "fragment.plan"
    tools = Toolbox(Workspace(tmp_path), plan_out=out)
    with pytest.raises(ToolFailure, match="not valid TOML or JSON"):
        tools.call("emit_tasks", {"fragment": "[[tasks]\nid = 1"})
    with pytest.raises(ToolFailure, match="the fragment has no tasks"):
        tools.call("emit_tasks", {"fragment": '{"task": []}'})
    assert not out.exists()
    assert tools.call("emit_tasks", {"fragment": FRAGMENT}) == (
        "the fragment holds 2 tasks; they run once this task has succeeded"
    )
    assert out.read_text() == FRAGMENT
    assert "emit_tasks" not in Toolbox(Workspace(tmp_path)).tools
