"""A scripted model server: a real local HTTP server speaking both wire formats the engine uses.

It answers `POST /v1/chat/completions` (OpenAI Chat Completions) and `POST /v1/messages` (Anthropic
Messages) with the next step of a script, and records every request it received, so tests exercise the
real clients, retries and pricing over real sockets. Point the engine at it with
`base_url = server.openai_base_url` (provider "openai") or `server.anthropic_base_url` ("anthropic").

A script is a list of steps (a JSON or YAML list, or a `steps` list in JSON, YAML or TOML). Each step
is one response, every key optional::

    [[steps]]
    text = "Looking around first."                                   # assistant text
    tool_calls = [{ name = "read_file", arguments = { path = "README.md" } }]
    # arguments may also be a string, sent as is: '{"path": ' is how a test sends malformed JSON
    usage = { input_tokens = 1200, output_tokens = 80, cache_read_tokens = 0, cache_write_tokens = 0 }
    # input_tokens counts every prompt token, cached ones included; each format gets its own spelling

    [[steps]]
    error = { status = 429, retry_after = "7", body = "rate limited" }   # an HTTP error response

    [[steps]]
    repeat = 3            # this step answers 3 requests
    delay = 0.01          # seconds to wait before answering (real time: keep it tiny)
    disconnect = true     # close the connection without answering (a connection error)

A request after the last step gets HTTP 400 "script exhausted".

Run it for the offline quick start::

    python -m stellafleet.testing.model_server SCRIPT [--port N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STEP_KEYS = {"text", "tool_calls", "usage", "error", "repeat", "delay", "disconnect", "stop_reason"}
USAGE_KEYS = {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"}


class ScriptError(ValueError):
    """A script that cannot be played; the message says which step and what is wrong."""


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def wire(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"


def _check_step(index: int, step: Any) -> dict[str, Any]:
    where = f"script step {index + 1}"
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: must be a table/object, not {type(step).__name__}")
    unknown = set(step) - STEP_KEYS
    if unknown:
        raise ScriptError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(STEP_KEYS))})"
        )
    for call in step.get("tool_calls") or []:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}: each tool call needs a name (and arguments)")
    usage = step.get("usage") or {}
    if not isinstance(usage, dict) or set(usage) - USAGE_KEYS:
        raise ScriptError(f"{where}: usage takes {', '.join(sorted(USAGE_KEYS))}")
    error = step.get("error")
    if error is not None and (not isinstance(error, dict) or not isinstance(error.get("status"), int)):
        raise ScriptError(f"{where}: error needs an integer status")
    repeat = step.get("repeat", 1)
    if not isinstance(repeat, int) or repeat < 1:
        raise ScriptError(f"{where}: repeat must be a whole number >= 1")
    return step


def expand_steps(steps: Sequence[Any]) -> list[dict[str, Any]]:
    """Checked steps, with each `repeat = N` step given N times."""
    expanded: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        checked = _check_step(index, step)
        expanded.extend([checked] * int(checked.get("repeat", 1)))
    return expanded


def load_script(path: Path) -> list[dict[str, Any]]:
    """The steps of a JSON, TOML or YAML script file."""
    text = Path(path).read_text(encoding="utf-8")
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            from ruamel.yaml import YAML

            data = YAML(typ="safe").load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise ScriptError(f"{path}: cannot parse the script: {exc}") from None
    if isinstance(data, dict):
        data = data.get("steps")
    if not isinstance(data, list):
        raise ScriptError(f"{path}: a script is a list of steps (or a `steps` list)")
    return expand_steps(data)


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
                "arguments": a if isinstance(a := _arguments(call), str) else json.dumps(a),
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
                "input": _arguments(call),
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


class ScriptedModelServer:
    """Plays steps to whoever asks, in order; thread-safe; use as a context manager."""

    def __init__(
        self,
        steps: Sequence[dict[str, Any]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
    ):
        self.steps = expand_steps(steps)
        self.requests: list[RecordedRequest] = []
        self.verbose = verbose
        self._lock = threading.Lock()
        self._served = 0
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @classmethod
    def from_file(cls, path: Path, **kwargs: Any) -> ScriptedModelServer:
        return cls(load_script(path), **kwargs)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.steps) - self._served

    def next_step(self, request: RecordedRequest) -> tuple[int, dict[str, Any] | None]:
        with self._lock:
            self.requests.append(request)
            if self._served >= len(self.steps):
                return self._served + 1, None
            self._served += 1
            return self._served, self.steps[self._served - 1]

    def start(self) -> ScriptedModelServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="scripted-model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def serve_forever(self) -> None:
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(server: ScriptedModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            if server.verbose:
                sys.stderr.write(f"model server: {format % args}\n")

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(
                200, {"server": "stellafleet scripted model server", "remaining_steps": server.remaining}
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            path = self.path.split("?", 1)[0]
            if not path.endswith(("/chat/completions", "/messages")):
                self._send(404, {"error": {"message": f"no such endpoint: {path}"}})
                return
            request = RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body)
            number, step = server.next_step(request)
            if step is None:
                message = f"scripted model server: script exhausted after {number - 1} responses"
                self._send(400, {"error": {"type": "invalid_request_error", "message": message}})
                return
            if step.get("delay"):
                time.sleep(float(step["delay"]))
            if step.get("disconnect"):
                self.close_connection = True
                return
            error = step.get("error")
            if error is not None:
                headers = (
                    {"retry-after": str(error["retry_after"])} if error.get("retry_after") is not None else {}
                )
                message = error.get("body", f"scripted error {error['status']}")
                self._send(
                    int(error["status"]), {"error": {"type": "scripted_error", "message": message}}, headers
                )
                return
            model = str(body.get("model", "scripted")) if isinstance(body, dict) else "scripted"
            build = anthropic_body if request.wire == "anthropic" else openai_body
            self._send(200, build(step, model, number))

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stellafleet.testing.model_server",
        description="Serve a scripted model over HTTP (OpenAI and Anthropic wire formats).",
    )
    parser.add_argument("script", type=Path, help="the script: a JSON, TOML or YAML list of steps")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    args = parser.parse_args(argv)
    try:
        server = ScriptedModelServer.from_file(args.script, host=args.host, port=args.port, verbose=True)
    except (ScriptError, OSError) as exc:
        print(f"model server: {exc}", file=sys.stderr)
        return 2
    print(f"scripted model server on {server.url} playing {len(server.steps)} responses from {args.script}")
    print(f'  provider = "openai"     base_url = "{server.openai_base_url}"')
    print(f'  provider = "anthropic"  base_url = "{server.anthropic_base_url}"', flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
