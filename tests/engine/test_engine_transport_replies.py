"""Replies a model server should not send: what the transport and each client make of them.

A real HTTP server on a loopback port answers each request with the next canned reply (status,
headers, raw body), so the clients read real responses through httpx.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stellafleet.core.config import Config
from stellafleet.engine.clients import make_client
from stellafleet.engine.errors import EngineError
from stellafleet.engine.messages import UserText
from stellafleet.engine.redact import Redactor
from stellafleet.engine.settings import load_settings
from stellafleet.engine.transport import HttpTransport
from stellafleet.testing.clock import FakeClock

Reply = tuple[int, dict[str, str], str]
KEY = "sk-test-" + "k" * 24


@contextmanager
def canned(replies: Sequence[Reply]) -> Iterator[tuple[str, list[str]]]:
    """A server answering POSTs with `replies` in order; yields its URL and the paths it was asked for."""
    pending, asked = list(replies), []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            asked.append(self.path)
            status, headers, body = pending.pop(0)
            data = body.encode()
            self.send_response(status)
            for name, value in {"content-type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", asked
    finally:
        httpd.shutdown()
        httpd.server_close()


def post(url: str, clock: FakeClock) -> dict[str, object]:
    transport = HttpTransport(
        label="openai",
        url=f"{url}/v1/chat/completions",
        headers={},
        timeout=5,
        max_retries=2,
        clock=clock,
        redact=Redactor([KEY]),
    )
    try:
        return transport.post({"model": "m"})
    finally:
        transport.close()


def test_a_reply_that_is_not_json_fails_at_once_with_an_excerpt() -> None:
    clock = FakeClock()
    html = (200, {"content-type": "text/html"}, "<html>\n  <b>proxy   error</b>\n</html>")
    with canned([html]) as (url, asked), pytest.raises(EngineError) as raised:
        post(url, clock)
    assert str(raised.value) == (
        f"openai request to {url}/v1/chat/completions failed: "
        "response is not JSON: <html> <b>proxy error</b> </html>"
    )
    assert len(asked) == 1 and clock.sleeps == [] and raised.value.status is None


def test_a_json_reply_that_is_not_an_object_fails() -> None:
    with canned([(200, {}, "[1, 2]")]) as (url, _), pytest.raises(EngineError) as raised:
        post(url, FakeClock())
    assert str(raised.value).endswith("failed: response is not a JSON object: [1, 2]")


def test_retry_after_ms_is_honoured_when_retry_after_is_absent() -> None:
    clock = FakeClock()
    replies = [(429, {"retry-after-ms": "1500"}, "{}"), (503, {"retry-after": "soon"}, "{}"), (200, {}, "{}")]
    with canned(replies) as (url, asked):
        assert post(url, clock) == {}
    assert len(asked) == 3 and clock.sleeps == [1.5, 2.0]  # a garbled Retry-After: the backoff


def test_a_refused_key_says_where_to_look_and_never_shows_the_key() -> None:
    refused = (401, {}, f'{{"error": "invalid key {KEY}"}}')
    with canned([refused]) as (url, asked), pytest.raises(EngineError) as raised:
        post(url, FakeClock())
    message = str(raised.value)
    assert raised.value.status == 401 and len(asked) == 1
    assert KEY not in message and "[redacted]" in message
    assert message.endswith("(check the API key and engine.api_key_env)")


@pytest.mark.parametrize(
    ("model", "body", "problem"),
    [
        ("gpt-test", '{"choices": []}', "IndexError('list index out of range')"),
        ("claude-test", '{"content": 5}', "TypeError(\"'int' object is not iterable\")"),
    ],
)
def test_a_reply_of_the_wrong_shape_names_the_problem(model: str, body: str, problem: str) -> None:
    with canned([(200, {}, body)]) as (url, asked):
        engine = {"model": model, "base_url": url, "provider": "anthropic" if "claude" in model else "openai"}
        client = make_client(load_settings(Config({"engine": engine}), env={}), clock=FakeClock(), env={})
        try:
            with pytest.raises(EngineError) as raised:
                client.complete("system", [UserText("hi")], [], 10)
        finally:
            client.close()
    assert str(raised.value).endswith(f"failed: unexpected response shape ({problem}): {body}")
    assert asked == ["/v1/messages" if "claude" in model else "/v1/chat/completions"]
