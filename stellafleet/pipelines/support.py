"""Turning what happened to an agent CLI into a result: failures, their one-line texts, output parsing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.spend import money
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.clirun import CliRun
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
    sys.stderr.writelines(f"  | {line}\n" for line in run.stdout_tail())
    sys.stderr.flush()
    return f"could not parse {cli} output: {detail}"


def json_line(line: str) -> dict[str, Any] | None:
    """The JSON object on one output line, or None when the line is not one."""
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class EventLines:
    """A CLI's JSON events, one per line, each handed to `event`; the first other line is kept."""

    kind: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.bad_line: str | None = None
        self.events = 0

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


def complete_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines a CLI appended to path since offset, and the offset after them."""
    with path.open("rb") as fh:
        fh.seek(offset)
        chunk = fh.read()
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset
    return chunk[: end + 1].decode("utf-8", "replace").splitlines(), offset + end + 1
