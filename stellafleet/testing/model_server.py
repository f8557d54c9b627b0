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
    # or a provider's own answer word for word: error = { status = 429, json = {...}, headers = {...} }

    [[steps]]
    repeat = 3            # this step answers 3 requests
    delay = 0.01          # seconds to wait before answering (real time: keep it tiny)
    disconnect = true     # close the connection without answering (a connection error)
    after = "is held by"  # answer only once some request (from any client) has contained this text

A request after the last step gets HTTP 400 "script exhausted".

Provider limits, across every client and ahead of the script (they use up no step):
`rate_limit=RateLimit(calls=N, retry_after=S)` answers the first N requests 429 with `Retry-After: S`,
and any request that comes back before the latest such answer's S seconds have passed gets 429 too (a
provider's window: `rate_limited` counts all of them); `usage_limit=UsageLimit(calls=M, reset_in=7200)`
answers the first M requests 429 with a usage-limit message naming a reset that far away (in Retry-After,
in words and as `resets_at`, as a provider's quota answer).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stellafleet.testing.model_routes import RecordedRequest, handler_for

__all__ = ["RateLimit", "RecordedRequest", "ScriptError", "ScriptedModelServer", "UsageLimit", "load_script"]

STEP_KEYS = {"text", "tool_calls", "usage", "error", "repeat", "delay", "disconnect", "stop_reason", "after"}
AFTER_TIMEOUT_S = 120.0  # how long a step waits for the request it comes after
USAGE_KEYS = {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"}


@dataclass(frozen=True)
class RateLimit:
    calls: int
    retry_after: float = 1.0


@dataclass(frozen=True)
class UsageLimit:
    calls: int = 1
    reset_in: float = 7200.0

    def error(self) -> dict[str, Any]:
        hours, rest = divmod(int(self.reset_in), 3600)
        minutes, seconds = divmod(rest, 60)
        message = f"You've hit your usage limit. Try again in {hours}h {minutes}m {seconds}s."
        # like a provider's quota answer: the reset in Retry-After, in words and as resets_at
        resets = {"resets_in_seconds": int(self.reset_in), "resets_at": int(time.time() + self.reset_in)}
        return {
            "status": 429,
            "retry_after": f"{self.reset_in:g}",
            "body": message,
            "type": "usage_limit_reached",
            "fields": resets,
        }


CHARS_PER_TOKEN = 4  # the cache accounting's estimate
PROMPT_KEYS = ("system", "instructions", "tools", "messages", "input")  # what a prompt is, in its order


def prompt_text(body: Any) -> str:
    """A request's prompt as the provider would cache it: its system text, tools and conversation."""
    if not isinstance(body, dict):
        return ""
    return json.dumps([body[key] for key in PROMPT_KEYS if key in body])


def common_prefix(one: str, other: str) -> int:
    size = min(len(one), len(other))
    for at in range(size):
        if one[at] != other[at]:
            return at
    return size


class ScriptError(ValueError):
    """A script that cannot be played; the message says which step and what is wrong."""


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


class ScriptedModelServer:
    """Plays steps to whoever asks, in order; thread-safe; use as a context manager.

    `scripts` gives several clients their own steps: a request goes to the first script whose key
    appears in its body (a marker in the task's prompt), else to the default `steps`.
    """

    def __init__(
        self,
        steps: Sequence[dict[str, Any]],
        *,
        scripts: Mapping[str, Sequence[dict[str, Any]]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
        rate_limit: RateLimit | None = None,
        usage_limit: UsageLimit | None = None,
    ):
        self.scripts: dict[str, list[dict[str, Any]]] = {"": expand_steps(steps)}
        for key, script in (scripts or {}).items():
            self.scripts[key] = expand_steps(script)
        self.steps = self.scripts[""]
        self.requests: list[RecordedRequest] = []
        self.unknown: list[RecordedRequest] = []  # requests to endpoints it does not serve
        self.verbose = verbose
        self._lock = threading.Condition()
        self._texts: list[str] = []  # every request body as JSON text, for `after`
        self._served = dict.fromkeys(self.scripts, 0)
        self.rate_limit, self.usage_limit = rate_limit, usage_limit
        self.rate_limited = 0  # requests answered 429 for the rate limit
        self.usage_limited = 0  # requests answered 429 for the usage limit
        self._window_ends = 0.0  # time.monotonic() until which the rate limit's window is in force
        self._httpd = ThreadingHTTPServer((host, port), handler_for(self))
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
            return sum(len(steps) - self._served[key] for key, steps in self.scripts.items())

    def script_for(self, request: RecordedRequest) -> str:
        text = json.dumps(request.body)
        return next((key for key in self.scripts if key and key in text), "")

    def _limited(self) -> dict[str, Any] | None:
        """The limit answer this request gets, ahead of the script (None: the script answers)."""
        usage, rate = self.usage_limit, self.rate_limit
        if usage is not None and self.usage_limited < usage.calls:
            self.usage_limited += 1
            return {"error": usage.error()}
        if rate is None:
            return None
        now = time.monotonic()
        if self.rate_limited < rate.calls or now < self._window_ends:
            if self.rate_limited < rate.calls:
                self._window_ends = max(self._window_ends, now + rate.retry_after)
            self.rate_limited += 1
            wait = max(self._window_ends - now, 0.001)
            return {"error": {"status": 429, "retry_after": f"{wait:.3f}", "body": "rate limited"}}
        return None

    def next_step(self, request: RecordedRequest) -> tuple[int, dict[str, Any] | None]:
        key = self.script_for(request)
        with self._lock:
            self.requests.append(request)
            self._texts.append(json.dumps(request.body))
            self._lock.notify_all()
            limited = self._limited()
            if limited is not None:
                return 0, limited
            served, steps = self._served[key], self.scripts[key]
            if served >= len(steps):
                return served + 1, None
            self._served[key] = served + 1
            after = steps[served].get("after")
            if after:
                # Lets a test order two clients: this answer waits for the other one's request.
                self._lock.wait_for(lambda: any(after in text for text in self._texts), AFTER_TIMEOUT_S)
            return served + 1, steps[served]

    def uncached_tokens(self, index: int) -> int:
        """The input tokens request `index` sends that are not in the prompt cache: a provider caches
        the prompts it was sent and serves the longest prefix of an earlier one (CHARS_PER_TOKEN
        characters a token), so only what comes after that prefix is uncached."""
        with self._lock:
            texts = [prompt_text(request.body) for request in self.requests[: index + 1]]
        cached = max((common_prefix(texts[-1], earlier) for earlier in texts[:-1]), default=0)
        return -(-(len(texts[-1]) - cached) // CHARS_PER_TOKEN)

    def record_unknown(self, request: RecordedRequest) -> None:
        with self._lock:
            self.unknown.append(request)
        if self.verbose:
            sys.stderr.write(f"model server: unknown request {request.method} {request.path}\n")

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
