"""The engine's session is its transcript: a follow-up reloads the conversation from it (model turns, tool
results, each resume's prompt) and goes on with only what is new."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stellafleet.engine.messages import AssistantTurn, Message, ToolCall, ToolResult, ToolResults, UserText

NO_RESULT = "(no result was recorded for this call)"


class _Replay:
    def __init__(self, path: Path, nudge: str, depth: int) -> None:
        self.path, self.nudge, self.depth = path, nudge, depth
        self.messages: list[Message] = []
        self.calls: tuple[ToolCall, ...] = ()
        self.results: list[ToolResult] = []

    def flush(self) -> None:
        """Every call of the last model turn gets its result (the API refuses a call without one)."""
        if self.calls:
            got = self.results[: len(self.calls)]
            got += [ToolResult(call.id, NO_RESULT, True) for call in self.calls[len(got) :]]
            self.messages.append(ToolResults(tuple(got)))
        self.calls, self.results = (), []

    def record(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "task":
            self.flush()
            self.messages = [UserText(f"Task:\n{record.get('task') or ''}")]
        elif kind == "resume":
            self.flush()
            earlier = record.get("from")
            if not self.messages and isinstance(earlier, str) and earlier and Path(earlier) != self.path:
                # it went on from another run's transcript (`--resume`): that conversation first
                self.messages = conversation(Path(earlier), self.nudge, self.depth + 1)
            self.messages.append(UserText(str(record.get("prompt") or "")))
        elif kind == "model":
            self.flush()
            raw = record.get("tool_calls") or []
            calls = tuple(
                ToolCall(str(c.get("id")), str(c.get("name")), str(c.get("arguments") or ""))
                for c in raw
                if isinstance(c, dict)
            )
            self.messages.append(AssistantTurn(str(record.get("text") or ""), calls))
            if calls:
                self.calls = calls
            else:
                self.messages.append(UserText(self.nudge))
        elif kind == "tool" and len(self.results) < len(self.calls):
            call = self.calls[len(self.results)]
            self.results.append(ToolResult(call.id, str(record.get("result")), bool(record.get("is_error"))))


MAX_DEPTH = 20  # transcripts a session may span (each `--resume` of a run is a new one)


def conversation(path: Path, nudge: str, depth: int = 0) -> list[Message]:
    """The conversation of the transcript's last session ([] when it has none): from its last `task`
    record on, with each `resume`'s prompt where it came."""
    if depth > MAX_DEPTH:
        return []
    replay = _Replay(path, nudge, depth)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            replay.record(record)
    replay.flush()
    return replay.messages
