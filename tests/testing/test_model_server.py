"""The scripted model server over real sockets: both wire formats, errors, recording, script files, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stellafleet.testing.model_server import ScriptedModelServer, ScriptError, load_script

STEPS = [
    {
        "text": "hi",
        "tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}],
        "usage": {"input_tokens": 100, "output_tokens": 5, "cache_read_tokens": 60, "cache_write_tokens": 10},
    },
    {"error": {"status": 429, "retry_after": "3", "body": "slow down"}},
]


def test_openai_wire_format_and_recorded_requests() -> None:
    with ScriptedModelServer(STEPS) as server:
        first = httpx.post(
            f"{server.openai_base_url}/chat/completions",
            json={"model": "m1", "messages": []},
            headers={"authorization": "Bearer k"},
        )
        second = httpx.post(f"{server.openai_base_url}/chat/completions", json={"model": "m1"})
        third = httpx.post(f"{server.openai_base_url}/chat/completions", json={"model": "m1"})
    body = first.json()
    message = body["choices"][0]["message"]
    assert body["model"] == "m1" and message["content"] == "hi"
    assert message["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "a.txt"}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert (
        body["usage"]["prompt_tokens"] == 100
        and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 60
    )
    assert (second.status_code, second.headers["retry-after"]) == (429, "3")
    assert second.json()["error"]["message"] == "slow down"
    assert third.status_code == 400 and "script exhausted after 2 responses" in third.text
    assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 3
    assert server.requests[0].headers["authorization"] == "Bearer k"
    assert server.requests[0].body == {"model": "m1", "messages": []}


def test_anthropic_wire_format() -> None:
    with ScriptedModelServer(STEPS[:1]) as server:
        body = httpx.post(f"{server.anthropic_base_url}/v1/messages", json={"model": "claude-x"}).json()
    assert body["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "toolu_1_0", "name": "read_file", "input": {"path": "a.txt"}},
    ]
    assert body["stop_reason"] == "tool_use"
    assert body["usage"] == {
        "input_tokens": 30,  # Anthropic counts cached tokens apart
        "output_tokens": 5,
        "cache_read_input_tokens": 60,
        "cache_creation_input_tokens": 10,
    }
    assert server.requests[0].wire == "anthropic"


def test_repeat_delay_disconnect_unknown_paths_and_status() -> None:
    steps = [{"repeat": 2, "text": "again", "delay": 0.01}, {"disconnect": True}]
    with ScriptedModelServer(steps) as server:
        assert httpx.get(server.url).json()["remaining_steps"] == 3
        assert httpx.post(f"{server.url}/v1/embeddings", json={}).status_code == 404
        for _ in range(2):
            assert httpx.post(f"{server.url}/v1/messages", json={}).json()["content"][0]["text"] == "again"
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{server.url}/v1/messages", json={})
        assert server.remaining == 0


def test_script_files_in_json_toml_and_yaml_are_the_same(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"steps": STEPS}))
    (tmp_path / "s.yaml").write_text(
        "- text: hi\n  tool_calls: [{name: read_file, arguments: {path: a.txt}}]\n"
        "  usage: {input_tokens: 100, output_tokens: 5, cache_read_tokens: 60, cache_write_tokens: 10}\n"
        "- error: {status: 429, retry_after: '3', body: slow down}\n"
    )
    (tmp_path / "s.toml").write_text(
        '[[steps]]\ntext = "hi"\ntool_calls = [{ name = "read_file", arguments = { path = "a.txt" } }]\n'
        "usage = { input_tokens = 100, output_tokens = 5, cache_read_tokens = 60, cache_write_tokens = 10 }\n"
        '[[steps]]\nerror = { status = 429, retry_after = "3", body = "slow down" }\n'
    )
    assert (
        load_script(tmp_path / "s.json")
        == load_script(tmp_path / "s.yaml")
        == load_script(tmp_path / "s.toml")
    )


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([{"txt": "typo"}], "script step 1: unknown key(s) txt"),
        ([{}, {"error": {"status": "429"}}], "script step 2: error needs an integer status"),
        ([{"tool_calls": [{"arguments": {}}]}], "each tool call needs a name"),
        ([{"repeat": 0}], "repeat must be a whole number"),
        (["hello"], "must be a table/object"),
    ],
)
def test_bad_scripts_are_refused_naming_the_step(steps: list[object], problem: str) -> None:
    with pytest.raises(ScriptError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        ScriptedModelServer(steps)  # type: ignore[arg-type]


def test_command_line_prints_its_url_and_serves(tmp_path: Path) -> None:
    script = tmp_path / "hello.toml"
    script.write_text('[[steps]]\ntext = "hello from the script"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet.testing.model_server", str(script), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("scripted model server on http://127.0.0.1:"), first
        url = first.split()[4]
        assert 'base_url = "' + url + '/v1"' in proc.stdout.readline()
        deadline = time.monotonic() + 10
        while True:
            try:
                reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "x"})
                break
            except httpx.ConnectError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert reply.json()["choices"][0]["message"]["content"] == "hello from the script"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run(
        [sys.executable, "-m", "stellafleet.testing.model_server", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "missing.json" in bad.stderr
