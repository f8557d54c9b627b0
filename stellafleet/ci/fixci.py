"""--fix-ci: what the watch hands the fleet's `CiFixer` for a red branch, with the failure excerpt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stellafleet.ci.gh import CiRun, GhError, GitHub


@dataclass(frozen=True)
class FixRequest:
    """One fix-up round for a red branch."""

    branch: str
    task_id: str
    round: int  # 1-based
    max_rounds: int
    head_sha: str
    reason: str  # the watch's verdict: "failure: CI / build"
    failure: str  # the failing jobs' log excerpt


@dataclass(frozen=True)
class FixOutcome:
    new_head: str | None  # None: nothing new to push; the branch stays red
    note: str


class CiFixer(Protocol):
    max_rounds: int

    def fix(self, request: FixRequest) -> FixOutcome:
        """Run one follow-up attempt for request's task; the branch's new head, or why there is none."""
        ...


def trim_log(text: str, limit_bytes: int) -> str:
    """The last limit_bytes of text (the end of a failing log is where the error is), cut at a line."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text.strip("\n")
    tail = data[-limit_bytes:].decode("utf-8", "ignore")
    cut = tail.find("\n")
    tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail
    return f"[... {len(data) - len(tail.encode())} earlier bytes left out ...]\n{tail.strip(chr(10))}"


def failure_excerpt(github: GitHub, runs: Sequence[CiRun], limit_bytes: int) -> str:
    """The failing runs' `--log-failed` output, each under its run's label, trimmed to limit_bytes."""
    parts: list[str] = []
    for run in (r for r in runs if r.red):
        try:
            log = github.failed_log(run.id)
        except GhError as exc:
            log = f"(could not fetch the log: {exc.message})"
        parts.append(f"== {run.label} ({run.conclusion}) {run.url}\n{log.strip()}")
    return trim_log("\n\n".join(parts), limit_bytes) if parts else "(no failing job log was available)"
