"""The conversation in a wire-neutral shape; each client converts it to its own format."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stellafleet.core.pricing import TokenUsage


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text the model sent (it may be malformed: the loop reports that)

    def parsed(self) -> Any:
        """The arguments as JSON (an empty call means no arguments); ValueError when malformed."""
        return json.loads(self.arguments) if self.arguments.strip() else {}


@dataclass(frozen=True)
class UserText:
    text: str


@dataclass(frozen=True)
class AssistantTurn:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class ToolResults:
    results: tuple[ToolResult, ...]


Message = UserText | AssistantTurn | ToolResults


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object


@dataclass(frozen=True)
class ModelReply:
    turn: AssistantTurn
    usage: TokenUsage
    stop_reason: str | None = None


def text_size(messages: list[Message]) -> int:
    size = 0
    for message in messages:
        if isinstance(message, UserText):
            size += len(message.text)
        elif isinstance(message, AssistantTurn):
            size += len(message.text) + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
        else:
            size += sum(len(r.content) + 20 for r in message.results)
    return size
