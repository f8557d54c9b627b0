"""The Anthropic Messages client (`/v1/messages`, tool_use blocks)."""

from __future__ import annotations

from typing import Any

from stellafleet.core.pricing import TokenUsage
from stellafleet.engine.messages import (
    AssistantTurn,
    Message,
    ModelReply,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserText,
)
from stellafleet.engine.transport import WireClient, arguments_text, token_count

ANTHROPIC_VERSION = "2023-06-01"


def _anthropic_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = call.parsed()
    except ValueError:
        arguments = {}
    arguments = arguments if isinstance(arguments, dict) else {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _tool_result(result: ToolResult) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": result.call_id,
        "content": result.content,
        "is_error": result.is_error,
    }


class AnthropicClient(WireClient):
    label = "anthropic"
    endpoint = staticmethod(_anthropic_url)

    @staticmethod
    def headers(api_key: str | None) -> dict[str, str]:
        return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": api_key} if api_key else {})}

    @staticmethod
    def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
        wire: list[dict[str, Any]] = []
        for message in messages:
            if isinstance(message, UserText):
                role, blocks = "user", [{"type": "text", "text": message.text}]
            elif isinstance(message, AssistantTurn):
                said = [{"type": "text", "text": message.text}] if message.text else []
                role, blocks = "assistant", said + [_tool_use(call) for call in message.tool_calls]
                blocks = blocks or [{"type": "text", "text": "(no reply)"}]
            else:
                role, blocks = "user", [_tool_result(result) for result in message.results]
            if wire and wire[-1]["role"] == role:  # the API wants user and assistant turns to alternate
                wire[-1]["content"].extend(blocks)
            else:
                wire.append({"role": role, "content": blocks})
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
        return self.send(body, self.reply)

    @staticmethod
    def reply(data: dict[str, Any]) -> ModelReply:
        blocks = data["content"]
        texts = [str(block.get("text") or "") for block in blocks if block.get("type") == "text"]
        calls = tuple(
            ToolCall(
                id=str(block.get("id") or f"toolu_{i}"),
                name=str(block.get("name") or ""),
                arguments=arguments_text(block.get("input")),
            )
            for i, block in enumerate(blocks)
            if block.get("type") == "tool_use"
        )
        return ModelReply(
            turn=AssistantTurn(text="\n".join(t for t in texts if t), tool_calls=calls),
            usage=usage_of(data.get("usage")),
            stop_reason=data.get("stop_reason"),
        )


def usage_of(usage: Any) -> TokenUsage:
    """Anthropic's usage block in the engine's convention (its input_tokens leave cached ones out)."""
    usage = usage if isinstance(usage, dict) else {}
    cache_read = token_count(usage.get("cache_read_input_tokens"))
    cache_write = token_count(usage.get("cache_creation_input_tokens"))
    return TokenUsage(
        input_tokens=token_count(usage.get("input_tokens")) + cache_read + cache_write,
        output_tokens=token_count(usage.get("output_tokens")),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
