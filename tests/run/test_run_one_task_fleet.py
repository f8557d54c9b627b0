"""`stella run` is a fleet of one task: it leaves the ledger rows of a one-task `stella fleet` run."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers.engine import HELLO_SESSION, make_repo

from stellafleet.cli import main
from stellafleet.testing.model_server import ScriptedModelServer

TABLES = ("runs", "tasks", "attempts", "spend_events", "commits")
PRICED = '[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n'

SUCCEEDS = HELLO_SESSION
FAILS = [
    {
        "tool_calls": [{"name": "finish", "arguments": {"summary": "cannot", "success": False}}],
        "usage": {"input_tokens": 1000, "output_tokens": 10},
    }
]


def run_and_read(
    root: Path, argv: list[str], script: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Run `stella ARGV` in a new repository at root against the scripted model; the ledger's rows."""
    make_repo(root)
    with ScriptedModelServer(script) as server:
        (root / ".stella").mkdir()
        (root / ".stella/config.toml").write_text(
            f'[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n'
            f"max_retries = 0\n{PRICED}"
        )
        main(["-C", str(root), *argv])
    conn = sqlite3.connect(root / ".stella/private/fleet.db")
    conn.row_factory = sqlite3.Row
    try:
        return {table: [dict(row) for row in conn.execute(f"SELECT * FROM {table}")] for table in TABLES}
    finally:
        conn.close()


def shape(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The columns each row has a value in."""
    return [sorted(column for column, value in row.items() if value is not None) for row in rows]


@pytest.mark.parametrize("script", [SUCCEEDS, FAILS], ids=["succeeded", "failed"])
def test_stella_run_leaves_the_rows_of_a_one_task_fleet(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch, script: list[dict[str, Any]]
) -> None:
    monkeypatch.chdir(tmp_path)
    single = run_and_read(tmp_path / "run", ["--spend-limit", "1", "run", "Add hello.txt"], script)
    fleet = run_and_read(tmp_path / "fleet", ["--spend-limit", "1", "fleet", "Add hello.txt"], script)
    for table in TABLES:
        assert shape(single[table]) == shape(fleet[table]), table
    status = "succeeded" if script is SUCCEEDS else "failed"
    for rows in (single, fleet):
        (run,), (task,), (attempt,) = rows["runs"], rows["tasks"], rows["attempts"]
        assert (run["status"], task["status"], attempt["outcome"]) == (status, status, status)
        assert (run["exit_code"], run["max_concurrency"], run["pipeline"]) == (
            int(status != "succeeded"),
            1,
            "plain",
        )
        assert attempt["spend_usd"] == pytest.approx(run["spend_usd"]) and attempt["spend_usd"] > 0
        assert run["base_ref"] == "main"  # the branch name, not HEAD, for both
    assert [event["usd"] for event in single["spend_events"]] == [
        event["usd"] for event in fleet["spend_events"]
    ]
    assert len(single["commits"]) == (1 if script is SUCCEEDS else 0)
    assert single["runs"][0]["argv"] == '["stella", "run", "Add hello.txt"]'
