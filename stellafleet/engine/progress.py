"""Plain progress lines from the engine's events (a worker's log, `stella run`'s output)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from stellafleet.core.spend import money

_MAIN_ARGUMENT = ("path", "pattern", "message", "command", "summary")


def short(text: str, limit: int = 300) -> str:
    """text on one line, cut to limit characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe_call(name: str, arguments: str, limit: int = 70) -> str:
    """`read_file src/app.py`: the tool and its telling argument, short."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = None
    if isinstance(args, dict):
        detail = next((args[key] for key in _MAIN_ARGUMENT if isinstance(args.get(key), str)), "")
    else:
        detail = "(malformed arguments)" if arguments else ""
    return f"{name} {short(detail, limit)}".rstrip()


class ProgressPrinter:
    """An engine event sink writing one line per step and tool call to each stream."""

    def __init__(self, streams: Sequence[TextIO], *, prefix: str = "  ") -> None:
        self.streams = list(streams)
        self.prefix = prefix
        self.usd = 0.0
        self.step = 0
        self.stop: str | None = None

    def _line(self, text: str) -> None:
        for stream in self.streams:
            stream.write(f"{self.prefix}{text}\n")
            stream.flush()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "step":
            self.step, self.usd = int(data["step"]), float(data["usd"])
            text = " ".join(str(data.get("text") or "").split())
            if text:
                self._line(f"step {self.step:>3}  {money(self.usd)}  {text[:100]}")
        elif kind == "tool":
            call = describe_call(str(data["name"]), str(data["arguments"]))
            line = f"step {self.step:>3}  {money(self.usd)}  {call}"
            if data.get("is_error"):
                first = str(data.get("result", "")).splitlines()[0] if data.get("result") else ""
                line += f"  -> {first[:120]}"
            self._line(line)
        elif kind == "end":
            self.stop = str(data.get("stop"))
