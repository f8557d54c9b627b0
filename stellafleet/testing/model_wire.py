"""The streaming wire formats of the scripted model server, as the real agent CLIs read them.

One script step becomes one streamed answer in the format the request asked for:

- Anthropic Messages with `stream: true` (Claude Code): `message_start`, one `content_block_start` /
  `content_block_delta` / `content_block_stop` per text or tool_use block (tool input sent as
  `input_json_delta` pieces), `message_delta` with the stop reason and the usage, `message_stop`.
- OpenAI Responses (Codex, `wire_api = "responses"`): `response.created`, the output items
  (`message`, `function_call`, or `custom_tool_call` for a freeform tool such as `apply_patch`) each as
  `response.output_item.added` / `.done`, then `response.completed` with the usage.
- OpenAI Chat Completions with `stream: true` (aider through litellm): `chat.completion.chunk`s, the
  usage in a last chunk when `stream_options.include_usage` asks for it, then `[DONE]`.

Each function returns (event name or None, JSON payload) pairs; the server writes them as SSE.
"""

from __future__ import annotations

import json
import time
from typing import Any

Event = tuple[str | None, Any]
CHUNK = 24  # characters per delta: small enough that every answer really arrives in pieces


def pieces(text: str, size: int = CHUNK) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def arguments_text(call: dict[str, Any]) -> str:
    """A tool call's arguments as the JSON text a model streams (a string is sent as is)."""
    value = call.get("arguments", {})
    return value if isinstance(value, str) else json.dumps(value)


def usage_of(step: dict[str, Any]) -> dict[str, int]:
    usage = step.get("usage") or {}
    return {key: int(usage.get(key, 0)) for key in ("input_tokens", "output_tokens", "cache_read_tokens")} | {
        "cache_write_tokens": int(usage.get("cache_write_tokens", 0))
    }


def anthropic_usage(step: dict[str, Any]) -> dict[str, int]:
    """Anthropic counts cached prompt tokens apart from input_tokens."""
    u = usage_of(step)
    return {
        "input_tokens": max(u["input_tokens"] - u["cache_read_tokens"] - u["cache_write_tokens"], 0),
        "output_tokens": u["output_tokens"],
        "cache_read_input_tokens": u["cache_read_tokens"],
        "cache_creation_input_tokens": u["cache_write_tokens"],
    }


def anthropic_events(step: dict[str, Any], model: str, number: int) -> list[Event]:
    usage = anthropic_usage(step)
    calls = step.get("tool_calls") or []
    message: dict[str, Any] = {
        "id": f"msg_scripted_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage | {"output_tokens": 0},
    }
    events: list[Event] = [("message_start", {"type": "message_start", "message": message})]
    blocks: list[tuple[dict[str, Any], str, list[str]]] = []
    if step.get("text"):
        blocks.append(({"type": "text", "text": ""}, "text_delta", pieces(str(step["text"]))))
    for i, call in enumerate(calls):
        block = {"type": "tool_use", "id": call.get("id") or f"toolu_{number}_{i}", "name": call["name"]}
        blocks.append((block | {"input": {}}, "input_json_delta", pieces(arguments_text(call))))
    for index, (block, delta_type, parts) in enumerate(blocks):
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        key = "text" if delta_type == "text_delta" else "partial_json"
        for part in parts:
            delta = {"type": delta_type, key: part}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = step.get("stop_reason") or ("tool_use" if calls else "end_turn")
    events.append(
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def responses_item(call: dict[str, Any], number: int, i: int) -> dict[str, Any]:
    """A tool call as a Responses output item: a function call, or a freeform (custom) tool call."""
    call_id = call.get("id") or f"call_{number}_{i}"
    if call.get("type") == "custom":
        raw = call.get("arguments", "")
        text = raw if isinstance(raw, str) else json.dumps(raw)
        return {
            "type": "custom_tool_call",
            "id": f"ctc_{number}_{i}",
            "call_id": call_id,
            "name": call["name"],
            "input": text,
        }
    return {
        "type": "function_call",
        "id": f"fc_{number}_{i}",
        "call_id": call_id,
        "name": call["name"],
        "arguments": arguments_text(call),
    }


def responses_usage(step: dict[str, Any]) -> dict[str, Any]:
    u = usage_of(step)
    return {
        "input_tokens": u["input_tokens"],
        "input_tokens_details": {"cached_tokens": u["cache_read_tokens"]},
        "output_tokens": u["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["input_tokens"] + u["output_tokens"],
    }


def responses_events(step: dict[str, Any], model: str, number: int) -> list[Event]:
    response_id = f"resp_scripted_{number}"
    base = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model}
    events: list[Event] = [
        ("response.created", {"type": "response.created", "response": base | {"status": "in_progress"}})
    ]
    items: list[dict[str, Any]] = []
    if step.get("text"):
        text = str(step["text"])
        items.append(
            {
                "type": "message",
                "id": f"msg_scripted_{number}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    items += [responses_item(call, number, i) for i, call in enumerate(step.get("tool_calls") or [])]
    for index, item in enumerate(items):
        events.append(
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": index, "item": item},
            )
        )
        if item["type"] == "message":
            for part in pieces(item["content"][0]["text"]):
                delta = {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": part,
                }
                events.append(("response.output_text.delta", delta))
        events.append(
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": index, "item": item},
            )
        )
    done = base | {"status": "completed", "output": items, "usage": responses_usage(step)}
    events.append(("response.completed", {"type": "response.completed", "response": done}))
    return events


def chat_chunks(step: dict[str, Any], model: str, number: int, *, include_usage: bool) -> list[Event]:
    base = {
        "id": f"chatcmpl-scripted-{number}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
        return None, base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": part}) for part in pieces(str(step.get("text") or ""))]
    calls = step.get("tool_calls") or []
    for i, call in enumerate(calls):
        head = {"index": i, "id": call.get("id") or f"call_{number}_{i}", "type": "function"}
        events.append(chunk({"tool_calls": [head | {"function": {"name": call["name"], "arguments": ""}}]}))
        for part in pieces(arguments_text(call)):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
    events.append(chunk({}, step.get("stop_reason") or ("tool_calls" if calls else "stop")))
    if include_usage:
        u = usage_of(step)
        usage = {
            "prompt_tokens": u["input_tokens"],
            "completion_tokens": u["output_tokens"],
            "total_tokens": u["input_tokens"] + u["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": u["cache_read_tokens"]},
        }
        events.append((None, base | {"choices": [], "usage": usage}))
    return events


def sse(events: list[Event], *, done_marker: bool = False) -> bytes:
    """The events as one Server-Sent Events body."""
    out: list[str] = []
    for name, payload in events:
        if name is not None:
            out.append(f"event: {name}\n")
        out.append(f"data: {json.dumps(payload)}\n\n")
    if done_marker:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


# Whole (not streamed) answers, for clients that do not ask for a stream.


def _arguments(call: dict[str, Any]) -> Any:
    return call.get("arguments", {})


def openai_body(step: dict[str, Any], model: str, number: int) -> dict[str, Any]:
    usage = step.get("usage") or {}
    calls = [
        {
            "id": call.get("id") or f"call_{number}_{i}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": a if isinstance(a := call.get("arguments", {}), str) else json.dumps(a),
            },
        }
        for i, call in enumerate(step.get("tool_calls") or [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": step.get("text")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-scripted-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": step.get("stop_reason") or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": int(usage.get("input_tokens", 0)),
            "completion_tokens": int(usage.get("output_tokens", 0)),
            "total_tokens": int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0)),
            "prompt_tokens_details": {"cached_tokens": int(usage.get("cache_read_tokens", 0))},
        },
    }


def anthropic_body(step: dict[str, Any], model: str, number: int) -> dict[str, Any]:
    usage = step.get("usage") or {}
    cache_read = int(usage.get("cache_read_tokens", 0))
    cache_write = int(usage.get("cache_write_tokens", 0))
    content: list[dict[str, Any]] = [{"type": "text", "text": step["text"]}] if step.get("text") else []
    for i, call in enumerate(step.get("tool_calls") or []):
        # A string is sent as is (real servers send an object): how a test feeds malformed input.
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{number}_{i}",
                "name": call["name"],
                "input": call.get("arguments", {}),
            }
        )
    return {
        "id": f"msg_scripted_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": step.get("stop_reason") or ("tool_use" if step.get("tool_calls") else "end_turn"),
        "usage": {
            # Anthropic counts cached prompt tokens apart from input_tokens.
            "input_tokens": max(int(usage.get("input_tokens", 0)) - cache_read - cache_write, 0),
            "output_tokens": int(usage.get("output_tokens", 0)),
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        },
    }
