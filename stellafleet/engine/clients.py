"""Model clients behind one Protocol, and the choice of one from the engine settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.limits import LimitReporter
from stellafleet.engine.anthropic import AnthropicClient
from stellafleet.engine.messages import Message, ModelReply, ToolSpec
from stellafleet.engine.openai import OpenAIClient
from stellafleet.engine.redact import Redactor
from stellafleet.engine.settings import EngineSettings


class ModelClient(Protocol):
    def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> ModelReply: ...

    def close(self) -> None: ...


def make_client(
    settings: EngineSettings,
    *,
    clock: Clock | None = None,
    redact: Redactor | None = None,
    env: Mapping[str, str] | None = None,
    limits: LimitReporter | None = None,
) -> ModelClient:
    """The client for settings.provider, with its key read from the environment now."""
    key = settings.api_key(env)
    redact = redact or Redactor()
    redact.add(key)
    client = AnthropicClient if settings.provider == "anthropic" else OpenAIClient
    return client(settings, key, clock=clock or SystemClock(), redact=redact, limits=limits)
