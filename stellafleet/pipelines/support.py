"""An agent CLI's run made a result (failures, their one-line texts, output parsing); engine log lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar, TextIO

from stellafleet.core.limits import LimitReporter
from stellafleet.core.spend import money
from stellafleet.core.terminal import one_line
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.clirun import TAIL_LINES, CliRun
from stellafleet.proc.runner import signal_description


def failed(summary: str, **totals: Any) -> PipelineResult:
    return PipelineResult(success=False, summary=summary, error=summary, **totals)


def timeout_text(cli: str, timeout_s: float | None, spent_usd: float | None = None) -> str:
    spent = "" if spent_usd is None else f" ({money(spent_usd)} spent)"
    return f"{cli} did not finish within the task timeout of {timeout_s:g}s and was stopped{spent}"


def crash_text(cli: str, run: CliRun) -> str:
    if run.start_error:
        return run.start_error
    detail = run.stderr_text()
    status = "no exit status" if run.returncode is None else signal_description(run.returncode)
    return f"{cli} ended ({status}) before reporting a result" + (f": {detail}" if detail else "")


def parse_failure(cli: str, detail: str, run: CliRun) -> str:
    """The message for output we could not understand; the raw tail goes to the worker's log."""
    sys.stderr.write(f"stella: could not parse {cli} output ({detail}); the last lines it printed were:\n")
    sys.stderr.writelines(f"  | {line}\n" for line in run.stdout_lines[-TAIL_LINES:])
    sys.stderr.flush()
    return f"could not parse {cli} output: {detail}"


def json_line(line: str) -> dict[str, Any] | None:
    """The JSON object on one output line, or None when the line is not one."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class EventLines:
    """A CLI's JSON events, one per line, each handed to `event`; the first other line is kept."""

    kind: ClassVar[str | None] = None

    def __init__(self, limits: LimitReporter | None = None) -> None:
        self.bad_line: str | None = None
        self.events = 0
        self.limits = limits  # where the limits the CLI reports go (the fleet)

    def __call__(self, line: str) -> str | None:
        if not line.strip():
            return None
        event = json_line(line)
        if event is None or (self.kind is not None and not isinstance(event.get(self.kind), str)):
            self.bad_line = self.bad_line or line
            return None
        self.events += 1
        try:
            return self.event(event)
        except ValueError as exc:  # an event we cannot read (a usage): said at the end, the CLI goes on
            self.bad_line = self.bad_line or f"{line} ({exc})"
            return None

    def event(self, event: dict[str, Any]) -> str | None:
        """Take one event in; a reason it returns stops the CLI."""
        raise NotImplementedError


class FileTail:
    """The complete lines a CLI appends to a file (its log), each read once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[str]:
        """The lines completed since the last call; none while the file is missing or half a line long."""
        if self.path is None:
            return []
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return chunk[:end].decode("utf-8", "replace").splitlines()


_MAIN_ARGUMENT = ("path", "pattern", "message", "command", "summary")


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
    return f"{name} {one_line(detail, limit)}".rstrip()


class ProgressPrinter:
    """An engine event sink writing one line per step and tool call to a stream (a worker's log)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.usd = 0.0
        self.step = 0

    def _line(self, text: str) -> None:
        self.stream.write(f"  step {self.step:>3}  {money(self.usd)}  {text}\n")
        self.stream.flush()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "step":
            self.step, self.usd = int(data["step"]), float(data["usd"])
            text = " ".join(str(data.get("text") or "").split())
            if text:
                self._line(text[:100])
        elif kind == "tool":
            line = describe_call(str(data["name"]), str(data["arguments"]))
            if data.get("is_error"):
                first = str(data.get("result", "")).splitlines()[0] if data.get("result") else ""
                line += f"  -> {first[:120]}"
            self._line(line)
