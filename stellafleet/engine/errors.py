"""Engine exceptions: the step loop's control flow, and the one failure a model call can end in."""

from __future__ import annotations

from stellafleet.core.errors import EXIT_TASK_FAILED, StellaError


class EngineError(StellaError):
    """A model request failed for good (after retries, or a status not worth retrying)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message, exit_code=EXIT_TASK_FAILED)
        self.status = status


class Finished(Exception):
    """The model called `finish`: the attempt is over."""

    def __init__(self, summary: str, success: bool) -> None:
        super().__init__(summary)
        self.summary = summary
        self.success = success


class Parked(Exception):
    """The model called `ask`: the attempt waits on a person's answer (its session goes on with it)."""

    def __init__(self, question: str) -> None:
        super().__init__(question)
        self.question = question


class LimitReached(Exception):
    """A limit (steps, wall time, spend guard) stops the attempt before the next model call."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class ToolFailure(Exception):
    """A tool call that cannot be carried out; its message goes back to the model as the result."""


class FormatError(ToolFailure):
    """The model's tool call itself is malformed: bad JSON, unknown tool, wrong or missing arguments."""
