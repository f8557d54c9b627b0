"""The scripted model server's HTTP side: which request gets which answer, streamed or whole.

- `POST /v1/messages` (Anthropic Messages; Claude Code adds `?beta=true`): the next step, as SSE when
  the body asks for `stream`, else one JSON message.
- `POST /v1/messages/count_tokens`: a token estimate, without using a step.
- `POST /v1/responses` (OpenAI Responses, as Codex uses it): the next step as SSE.
- `POST /v1/chat/completions` (OpenAI Chat Completions): the next step, streamed or whole.
- `GET`/`HEAD` anywhere: 200 with the server's state (clients probe the base URL).
Anything else is recorded as unknown and answered 404, so a test can see what a client tried.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from stellafleet.testing import model_wire as wire

ANSWERED = ("/messages", "/responses", "/chat/completions")


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    method: str = "POST"

    @property
    def wire(self) -> str:
        """anthropic (Messages), responses (OpenAI Responses) or openai (Chat Completions)."""
        if self.path.endswith("/messages"):
            return "anthropic"
        return "responses" if self.path.endswith("/responses") else "openai"

    @property
    def streamed(self) -> bool:
        return self.wire == "responses" or (isinstance(self.body, dict) and bool(self.body.get("stream")))


class StepSource(Protocol):
    verbose: bool

    @property
    def remaining(self) -> int: ...

    def next_step(self, request: RecordedRequest) -> tuple[int, dict[str, Any] | None]: ...

    def record_unknown(self, request: RecordedRequest) -> None: ...


def count_tokens(body: Any) -> int:
    """A rough estimate (four characters a token), all count_tokens callers need here."""
    return max(1, len(json.dumps(body)) // 4)


def streamed_answer(request: RecordedRequest, step: dict[str, Any], model: str, number: int) -> bytes:
    if request.wire == "anthropic":
        return wire.sse(wire.anthropic_events(step, model, number))
    if request.wire == "responses":
        return wire.sse(wire.responses_events(step, model, number))
    options = request.body.get("stream_options") if isinstance(request.body, dict) else None
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return wire.sse(wire.chat_chunks(step, model, number, include_usage=include_usage), done_marker=True)


class ScriptHandler(BaseHTTPRequestHandler):
    source: StepSource  # set by handler_for
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.source.verbose:
            sys.stderr.write(f"model server: {format % args}\n")

    def _send_bytes(self, status: int, data: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self._send_bytes(status, data, "application/json", headers or {})

    def _state(self) -> None:
        self._send(
            200, {"server": "stellafleet scripted model server", "remaining_steps": self.source.remaining}
        )

    def do_GET(self) -> None:
        self._state()

    def do_HEAD(self) -> None:
        self._state()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        path = self.path.split("?", 1)[0]
        request = RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body)
        if path.endswith("/messages/count_tokens"):
            self._send(200, {"input_tokens": count_tokens(body)})
            return
        if not path.endswith(ANSWERED):
            self.source.record_unknown(request)
            self._send(404, {"error": {"type": "not_found_error", "message": f"no such endpoint: {path}"}})
            return
        self._answer(request)

    def _answer(self, request: RecordedRequest) -> None:
        number, step = self.source.next_step(request)
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
            self._error(error)
            return
        body = request.body
        model = str(body.get("model", "scripted")) if isinstance(body, dict) else "scripted"
        if request.streamed:
            data = streamed_answer(request, step, model, number)
            self._send_bytes(200, data, "text/event-stream", {"cache-control": "no-cache"})
            return
        build = wire.anthropic_body if request.wire == "anthropic" else wire.openai_body
        self._send(200, build(step, model, number))

    def _error(self, error: dict[str, Any]) -> None:
        headers = {"retry-after": str(error["retry_after"])} if error.get("retry_after") is not None else {}
        headers.update(error.get("headers") or {})  # a provider's own, as it sends them
        if error.get("json") is not None:  # a provider's real answer, word for word
            self._send(int(error["status"]), error["json"], headers)
            return
        message = error.get("body", f"scripted error {error['status']}")
        kind = error.get("type", "rate_limit_error" if error["status"] == 429 else "scripted_error")
        fields = error.get("fields") or {}
        self._send(int(error["status"]), {"error": {"type": kind, "message": message, **fields}}, headers)


def handler_for(server: StepSource) -> type[BaseHTTPRequestHandler]:
    """A request handler class that answers from server's script."""
    return type("Handler", (ScriptHandler,), {"source": server})
