"""The fake `claude` itself, run as a process: its refusals, modes, output formats and PreToolUse hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stellafleet.testing.fake_agent import LOG_ENV, SCRIPT_ENV


def claude(cwd: Path, *args: str, script: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in (SCRIPT_ENV, LOG_ENV)}
    if script is not None:
        env[SCRIPT_ENV] = json.dumps(script)
    return subprocess.run(
        [sys.executable, "-m", "stellafleet.testing.fake_claude", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_it_refuses_what_the_real_cli_refuses(tmp_path: Path) -> None:
    not_print = claude(tmp_path, "do it")
    assert (not_print.returncode, not_print.stdout) == (2, "")
    assert "only does print mode (-p)" in not_print.stderr
    quiet_stream = claude(tmp_path, "-p", "--output-format", "stream-json", "do it")
    assert quiet_stream.returncode == 1
    assert "stream-json requires --verbose" in quiet_stream.stderr
    unknown = claude(tmp_path, "-p", "--output-format", "json", "do it", script={"mode": "sideways"})
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert "unknown mode 'sideways'" in unknown.stderr


def test_json_result_of_a_scripted_edit_and_the_budget_it_exceeds(tmp_path: Path) -> None:
    script = {"edits": [{"path": "a.txt", "content": "hello\n"}], "cost": 0.5, "num_turns": 4}
    done = claude(tmp_path, "-p", "--output-format", "json", "do it", script=script)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["subtype"], result["is_error"], result["result"]) == ("success", False, "Done: a.txt")
    assert (result["total_cost_usd"], result["num_turns"], result["permission_denials"]) == (0.5, 4, [])
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    over = claude(
        tmp_path, "-p", "--output-format", "json", "--max-budget-usd", "0.25", "do it", script=script
    )
    assert over.returncode == 1
    assert json.loads(over.stdout)["subtype"] == "error_max_budget_usd"


def test_text_output_is_the_result_alone(tmp_path: Path) -> None:
    done = claude(tmp_path, "-p", "do it", script={"result": "All done."})
    assert (done.returncode, done.stdout) == (0, "All done.\n")


def test_stream_json_runs_the_hooks_and_reports_the_refused_edit(tmp_path: Path) -> None:
    hook = {"type": "command", "command": "echo 'not this file' >&2; exit 2"}
    settings = {"hooks": {"PreToolUse": [{"matcher": "Write|Edit", "hooks": [hook]}]}}
    script = {"edits": [{"path": "a.txt", "content": "hello\n"}]}
    args = ("-p", "--verbose", "--output-format", "stream-json", "--model", "claude-opus-4-1")
    done = claude(tmp_path, *args, "--settings", json.dumps(settings), "do it", script=script)
    assert done.returncode == 0, done.stderr
    messages = [json.loads(line) for line in done.stdout.splitlines()]
    assert messages[0]["type"] == "system" and messages[0]["model"] == "claude-opus-4-1"
    refused = messages[2]["message"]["content"][0]
    assert (refused["type"], refused["content"], refused["is_error"]) == (
        "tool_result",
        "not this file",
        True,
    )
    result = messages[-1]
    assert (
        result["type"] == "result" and result["result"] == "Done: nothing to change (1 edit(s) were refused)"
    )
    assert [denial["tool_name"] for denial in result["permission_denials"]] == ["Write"]
    assert not (tmp_path / "a.txt").exists()
