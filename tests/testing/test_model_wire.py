"""The scripted model server's streaming formats, probes and routing, over real sockets."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from stellafleet.testing.model_server import ScriptedModelServer

STEP = {
    "text": "Writing the file now.",
    "tool_calls": [{"name": "Write", "arguments": {"file_path": "/w/a.txt", "content": "a\n"}}],
    "usage": {"input_tokens": 1200, "output_tokens": 80, "cache_read_tokens": 200},
}


def post(url: str, body: Any, method: str = "POST") -> tuple[int, str, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


def events(text: str) -> list[tuple[str | None, Any]]:
    """(event name, data) pairs of an SSE body; `[DONE]` as the string."""
    found: list[tuple[str | None, Any]] = []
    for block in text.strip().split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:] if line[6:] == "[DONE]" else json.loads(line[6:])
        found.append((name, data))
    return found


def test_anthropic_streaming_carries_text_tool_input_pieces_and_usage() -> None:
    with ScriptedModelServer([STEP]) as server:
        status, kind, body = post(f"{server.url}/v1/messages?beta=true", {"model": "m", "stream": True})
    assert (status, kind) == (200, "text/event-stream")
    got = events(body)
    names = [name for name, _ in got]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    pieces = [d["delta"]["partial_json"] for n, d in got if n == "content_block_delta" and d["index"] == 1]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == STEP["tool_calls"][0]["arguments"]
    text = "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta" and d["index"] == 0)
    assert text == STEP["text"]
    delta = dict(got)["message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"] == {
        "input_tokens": 1000,
        "output_tokens": 80,
        "cache_read_input_tokens": 200,
        "cache_creation_input_tokens": 0,
    }


def test_responses_stream_items_and_usage_as_codex_reads_them() -> None:
    custom = {"name": "apply_patch", "type": "custom", "arguments": "*** Begin Patch\n*** End Patch\n"}
    step = {**STEP, "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "ls"}}, custom]}
    with ScriptedModelServer([step]) as server:
        status, kind, body = post(f"{server.url}/v1/responses", {"model": "gpt-5", "stream": True})
    assert (status, kind) == (200, "text/event-stream")
    got = events(body)
    done = [d["item"] for n, d in got if n == "response.output_item.done"]
    assert [item["type"] for item in done] == ["message", "function_call", "custom_tool_call"]
    assert json.loads(done[1]["arguments"]) == {"cmd": "ls"} and done[2]["input"].startswith("*** Begin")
    completed = got[-1][1]["response"]
    assert got[-1][0] == "response.completed"
    assert completed["usage"]["input_tokens"] == 1200
    assert completed["usage"]["input_tokens_details"] == {"cached_tokens": 200}


def test_chat_completions_stream_in_chunks_with_a_usage_chunk_and_done() -> None:
    with ScriptedModelServer([STEP]) as server:
        request = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
        status, _, body = post(f"{server.url}/v1/chat/completions", request)
    assert status == 200
    got = [data for _, data in events(body)]
    assert got[-1] == "[DONE]"
    assert got[-2]["usage"]["prompt_tokens"] == 1200
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in got[:-2])
    assert content == STEP["text"]
    finish = [c["choices"][0]["finish_reason"] for c in got[:-2] if c["choices"][0]["finish_reason"]]
    assert finish == ["tool_calls"]


def test_probes_and_count_tokens_use_no_step_and_unknown_paths_are_recorded() -> None:
    with ScriptedModelServer([STEP]) as server:
        assert post(f"{server.url}/api/hello", None, method="HEAD")[0] == 200
        status, _, body = post(f"{server.url}/v1/messages/count_tokens", {"messages": [{"content": "hi"}]})
        assert status == 200 and json.loads(body)["input_tokens"] > 0
        assert post(f"{server.url}/v1/embeddings", {"input": "x"})[0] == 404
        assert server.remaining == 1
        assert [(r.method, r.path) for r in server.unknown] == [("POST", "/v1/embeddings")]


def test_scripts_are_chosen_by_a_marker_and_after_orders_two_clients() -> None:
    scripts = {"TASK-A": [{"text": "a", "after": "TASK-B"}], "TASK-B": [{"text": "b"}]}
    answers: dict[str, str] = {}

    def ask(marker: str) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": marker}]}
        answers[marker] = json.loads(post(f"{server.url}/v1/chat/completions", body)[2])["choices"][0][
            "message"
        ]["content"]

    with ScriptedModelServer([], scripts=scripts) as server:
        first = threading.Thread(target=ask, args=("TASK-A",))
        first.start()
        first.join(timeout=0.3)
        assert first.is_alive()  # held until a request mentioning TASK-B arrives
        ask("TASK-B")
        first.join(timeout=10)
    assert answers == {"TASK-A": "a", "TASK-B": "b"}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_whole_answers_still_come_without_stream(path: str) -> None:
    with ScriptedModelServer([STEP]) as server:
        status, kind, body = post(f"{server.url}{path}", {"model": "m"})
    assert (status, kind) == (200, "application/json")
    assert "Writing the file now." in body
