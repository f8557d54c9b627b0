"""The OpenAI Chat Completions client, for OpenAI and every server compatible with it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from stellafleet.core.pricing import TokenUsage
from stellafleet.engine.messages import AssistantTurn, Message, ModelReply, ToolCall, ToolSpec, UserText
from stellafleet.engine.transport import WireClient, arguments_text, token_count


def _openai_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if urlsplit(base).path in ("", "/"):
        base += "/v1"
    return base + "/chat/completions"


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class OpenAIClient(WireClient):
    label = "openai"
    endpoint = staticmethod(_openai_url)

    @staticmethod
    def headers(api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    @staticmethod
    def wire_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for message in messages:
            if isinstance(message, UserText):
                wire.append({"role": "user", "content": message.text})
            elif isinstance(message, AssistantTurn):
                item: dict[str, Any] = {"role": "assistant", "content": message.text}
                if message.tool_calls:  # beside tool calls, no text is sent as null
                    calls = [_function_call(call) for call in message.tool_calls]
                    item.update(content=message.text or None, tool_calls=calls)
                wire.append(item)
            else:
                wire.extend(
                    {"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in message.results
                )
        return wire

    def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> ModelReply:
        # OpenAI's own newer models take max_completion_tokens; compatible servers know max_tokens.
        official = urlsplit(self.settings.base_url).hostname == "api.openai.com"
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": self.wire_messages(system, messages),
            "max_completion_tokens" if official else "max_tokens": max_tokens,
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
        return self.send(body, self.reply)

    @staticmethod
    def reply(data: dict[str, Any]) -> ModelReply:
        choice = data["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                id=str(raw.get("id") or f"call_{i}"),
                name=str(raw["function"].get("name") or ""),
                arguments=arguments_text(raw["function"].get("arguments")),
            )
            for i, raw in enumerate(message.get("tool_calls") or [])
        )
        content = message.get("content") or ""
        if isinstance(content, list):  # some servers send content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return ModelReply(
            turn=AssistantTurn(text=str(content), tool_calls=calls),
            # prompt_tokens already include the cached ones: the engine's convention as is.
            usage=TokenUsage(
                input_tokens=token_count(usage.get("prompt_tokens")),
                output_tokens=token_count(usage.get("completion_tokens")),
                cache_read_tokens=token_count(details.get("cached_tokens")),
            ),
            stop_reason=choice.get("finish_reason"),
        )
