"""Model clients: OpenAI Chat Completions and Anthropic Messages over httpx, behind one Protocol.

Both retry 429, 5xx and connection errors with exponential backoff, honouring Retry-After (seconds or an
HTTP date), sleeping through the injected clock. The last failure is an EngineError with the status and a
short excerpt of the body, with any key masked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.pricing import TokenUsage
from stellafleet.engine.errors import EngineError
from stellafleet.engine.messages import (
    AssistantTurn,
    Message,
    ModelReply,
    ToolCall,
    ToolResults,
    ToolSpec,
    UserText,
)
from stellafleet.engine.redact import Redactor
from stellafleet.engine.settings import EngineSettings

ANTHROPIC_VERSION = "2023-06-01"
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


class ModelClient(Protocol):
    def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> ModelReply: ...

    def close(self) -> None: ...


def retry_after_seconds(value: str | None, now_wall: float) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP date; None when absent or garbled."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now_wall, 0.0)


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


class HttpTransport:
    """POST JSON with retries; one instance per client."""

    def __init__(
        self,
        *,
        label: str,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        max_retries: int,
        clock: Clock,
        redact: Redactor,
        wall: Callable[[], float] = time.time,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        max_retry_after: float = 300.0,
    ) -> None:
        self.label = label
        self.url = url
        self.max_retries = max_retries
        self.clock = clock
        self.redact = redact
        self.wall = wall
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self.http = httpx.Client(headers=dict(headers), timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _fail(self, message: str, status: int | None = None) -> EngineError:
        return EngineError(
            self.redact(f"{self.label} request to {self.url} failed: {message}"), status=status
        )

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            try:
                response = self.http.post(self.url, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts:
                    raise self._fail(f"{problem} (after {attempts} attempts)") from None
            else:
                if response.status_code < 300:
                    try:
                        data = response.json()
                    except ValueError:
                        raise self._fail(f"response is not JSON: {_excerpt(response.text)}") from None
                    if not isinstance(data, dict):
                        raise self._fail(f"response is not a JSON object: {_excerpt(response.text)}")
                    return data
                status = response.status_code
                detail = f"HTTP {status}: {_excerpt(response.text)}"
                if status not in RETRY_STATUSES:
                    if status in (401, 403):
                        detail += " (check the API key and engine.api_key_env)"
                    raise self._fail(detail, status)
                if attempt == attempts:
                    raise self._fail(f"{detail} (after {attempts} attempts)", status)
                wait = retry_after_seconds(response.headers.get("retry-after"), self.wall())
                if wait is None and response.headers.get("retry-after-ms"):
                    wait = retry_after_seconds(response.headers["retry-after-ms"], 0.0)
                    wait = None if wait is None else wait / 1000
            if wait is None:
                wait = min(self.backoff_base * 2 ** (attempt - 1), self.backoff_max)
            self.clock.sleep(min(wait, self.max_retry_after))
        raise AssertionError("unreachable")


def _openai_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if urlsplit(base).path in ("", "/"):
        base += "/v1"
    return base + "/chat/completions"


def _anthropic_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def _arguments_text(value: Any) -> str:
    """Tool arguments as JSON text; some servers send an object, some a string (maybe malformed)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


class OpenAIClient:
    """OpenAI Chat Completions, and every server compatible with it (Ollama, vLLM, llama.cpp, ...)."""

    def __init__(
        self, settings: EngineSettings, api_key: str | None, *, clock: Clock, redact: Redactor
    ) -> None:
        self.settings = settings
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.transport = HttpTransport(
            label="openai",
            url=_openai_url(settings.base_url),
            headers=headers,
            timeout=settings.request_timeout,
            max_retries=settings.max_retries,
            clock=clock,
            redact=redact,
        )
        # OpenAI's own newer models take max_completion_tokens; compatible servers know max_tokens.
        host = urlsplit(settings.base_url).hostname or ""
        self._max_tokens_key = "max_completion_tokens" if host == "api.openai.com" else "max_tokens"

    def close(self) -> None:
        self.transport.close()

    @staticmethod
    def wire_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for message in messages:
            if isinstance(message, UserText):
                wire.append({"role": "user", "content": message.text})
            elif isinstance(message, AssistantTurn):
                item: dict[str, Any] = {"role": "assistant", "content": message.text or None}
                if message.tool_calls:
                    item["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in message.tool_calls
                    ]
                else:
                    item["content"] = message.text
                wire.append(item)
            elif isinstance(message, ToolResults):
                wire.extend(
                    {"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in message.results
                )
        return wire

    def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> ModelReply:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": self.wire_messages(system, messages),
            self._max_tokens_key: max_tokens,
            "stream": False,
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        data = self.transport.post(body)
        try:
            choice = data["choices"][0]
            message = choice["message"]
            calls = tuple(
                ToolCall(
                    id=str(raw.get("id") or f"call_{i}"),
                    name=str(raw["function"].get("name") or ""),
                    arguments=_arguments_text(raw["function"].get("arguments")),
                )
                for i, raw in enumerate(message.get("tool_calls") or [])
            )
            content = message.get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise self.transport._fail(
                f"unexpected response shape ({exc!r}): {_excerpt(json.dumps(data))}"
            ) from None
        if isinstance(content, list):  # some servers send content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return ModelReply(
            turn=AssistantTurn(text=str(content), tool_calls=calls),
            # prompt_tokens already include the cached ones: the engine's convention as is.
            usage=TokenUsage(
                input_tokens=_int(usage.get("prompt_tokens")),
                output_tokens=_int(usage.get("completion_tokens")),
                cache_read_tokens=_int(details.get("cached_tokens")),
            ),
            stop_reason=choice.get("finish_reason"),
            raw_model=data.get("model"),
        )


class AnthropicClient:
    """Anthropic Messages (`/v1/messages`, tool_use blocks)."""

    def __init__(
        self, settings: EngineSettings, api_key: str | None, *, clock: Clock, redact: Redactor
    ) -> None:
        self.settings = settings
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        self.transport = HttpTransport(
            label="anthropic",
            url=_anthropic_url(settings.base_url),
            headers=headers,
            timeout=settings.request_timeout,
            max_retries=settings.max_retries,
            clock=clock,
            redact=redact,
        )

    def close(self) -> None:
        self.transport.close()

    @staticmethod
    def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
        wire: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            if wire and wire[-1]["role"] == role:  # the API wants user and assistant turns to alternate
                wire[-1]["content"].extend(blocks)
            else:
                wire.append({"role": role, "content": blocks})

        for message in messages:
            if isinstance(message, UserText):
                add("user", [{"type": "text", "text": message.text}])
            elif isinstance(message, AssistantTurn):
                blocks: list[dict[str, Any]] = (
                    [{"type": "text", "text": message.text}] if message.text else []
                )
                for call in message.tool_calls:
                    try:
                        arguments = call.parsed()
                    except ValueError:
                        arguments = {}
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            "input": arguments if isinstance(arguments, dict) else {},
                        }
                    )
                add("assistant", blocks or [{"type": "text", "text": "(no reply)"}])
            elif isinstance(message, ToolResults):
                add(
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": r.call_id,
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in message.results
                    ],
                )
        return wire

    def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> ModelReply:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "system": system,
            "messages": self.wire_messages(messages),
            "max_tokens": max_tokens,
        }
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        data = self.transport.post(body)
        texts: list[str] = []
        calls: list[ToolCall] = []
        try:
            for i, block in enumerate(data["content"]):
                if block.get("type") == "text":
                    texts.append(str(block.get("text") or ""))
                elif block.get("type") == "tool_use":
                    calls.append(
                        ToolCall(
                            id=str(block.get("id") or f"toolu_{i}"),
                            name=str(block.get("name") or ""),
                            arguments=_arguments_text(block.get("input")),
                        )
                    )
        except (KeyError, TypeError, AttributeError) as exc:
            raise self.transport._fail(
                f"unexpected response shape ({exc!r}): {_excerpt(json.dumps(data))}"
            ) from None
        usage = data.get("usage") or {}
        cache_read = _int(usage.get("cache_read_input_tokens"))
        cache_write = _int(usage.get("cache_creation_input_tokens"))
        return ModelReply(
            turn=AssistantTurn(text="\n".join(t for t in texts if t), tool_calls=tuple(calls)),
            # Anthropic's input_tokens leave the cached ones out: add them back for the engine's convention.
            usage=TokenUsage(
                input_tokens=_int(usage.get("input_tokens")) + cache_read + cache_write,
                output_tokens=_int(usage.get("output_tokens")),
                cache_read_tokens=cache_read,
                cache_write_tokens=cache_write,
            ),
            stop_reason=data.get("stop_reason"),
            raw_model=data.get("model"),
        )


def make_client(
    settings: EngineSettings,
    *,
    clock: Clock | None = None,
    redact: Redactor | None = None,
    env: Mapping[str, str] | None = None,
) -> ModelClient:
    """The client for settings.provider, with its key read from the environment now."""
    key = settings.api_key(env)
    redact = redact or Redactor()
    redact.add(key)
    clock = clock or SystemClock()
    if settings.provider == "anthropic":
        return AnthropicClient(settings, key, clock=clock, redact=redact)
    return OpenAIClient(settings, key, clock=clock, redact=redact)
