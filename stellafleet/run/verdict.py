"""How an attempt ended, as the ledger stores it: the verdict on a worker's end."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from stellafleet.core.status import AttemptOutcome, StopReason
from stellafleet.run.executor import Ending


@dataclass
class Record:
    """How an attempt ended, as the ledger stores it."""

    outcome: AttemptOutcome
    summary: str
    error: str | None = None
    exit_code: int | None = None
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None

    @classmethod
    def failed(cls, text: str) -> Record:
        return cls(AttemptOutcome.FAILED, text, text)

    @property
    def reason(self) -> str | None:
        """Why the task did not succeed (None: it did)."""
        return None if self.outcome == AttemptOutcome.SUCCEEDED else (self.error or self.summary)


def judge(ending: Ending) -> Record:
    """The record of a worker's end: succeeded only when it exited 0 with a successful result."""
    exit_info, stop_reason, result = ending.exit, ending.stop_reason, ending.result
    measured: dict[str, Any] = {
        "exit_code": exit_info.returncode,
        "cpu_seconds": round(exit_info.cpu_seconds, 3),
        "peak_rss_bytes": exit_info.peak_rss_bytes or None,
    }
    if exit_info.returncode == 0 and result is not None and result.success:
        return Record(AttemptOutcome.SUCCEEDED, result.summary or "done", None, **measured)
    if stop_reason is not None:
        interrupted = stop_reason.reason is StopReason.INTERRUPTED
        outcome = AttemptOutcome.INTERRUPTED if interrupted else AttemptOutcome.FAILED
        error = f"{stop_reason} (worker {exit_info.describe()})"
        summary = result.summary if result is not None and result.summary else str(stop_reason)
        return Record(outcome, summary, error, **measured)
    if result is None:
        error = (
            f"worker {exit_info.describe()}"
            if exit_info.returncode != 0
            else "worker exited without leaving a result"
        )
        return Record(AttemptOutcome.FAILED, error, error, **measured)
    error = result.error or f"worker {exit_info.describe()}"
    return Record(AttemptOutcome.FAILED, result.summary or error, error, **measured)


def stalled_record(record: Record, evidence: str) -> Record:
    """The record of a worker the watchdog stopped: `stalled`, the evidence as summary and reason."""
    if record.outcome == AttemptOutcome.SUCCEEDED:  # it finished just as it was stopped
        return record
    return replace(record, outcome=AttemptOutcome.STALLED, summary=evidence, error=evidence)
