"""The states of a run, a task, an attempt and a watched branch, stop reasons and attempt ends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SPEND_LIMITED = "spend_limited"
    USAGE_LIMITED = "usage_limited"  # a provider's usage limit stopped it (exit 3; --resume goes on)
    INTERRUPTED = "interrupted"
    PARKED = "parked"  # only tasks waiting on a person and their dependents were left (exit 5)


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    STALLED = "stalled"  # its attempt was stopped by the watchdog (AttemptOutcome.STALLED)
    PARKED = "parked"  # its attempt waits on a person's answer (AttemptOutcome.PARKED)


class AttemptOutcome(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    # The watchdog stopped a worker that showed no CPU time, output or spend for `[fleet] idle_timeout`.
    STALLED = "stalled"
    # Its fleet died; the next stella command that opened the ledger finalised it.
    ABANDONED = "abandoned"
    # It needs a person (a permission outside the task's allow-list, the engine's `ask`): its worktree and
    # session are kept, its slot freed, a `needs_you` answer request waits (`stella inbox`, `stella answer`)
    PARKED = "parked"


class StopReason(StrEnum):
    """Why a run, a task or an attempt stopped short: code decides by these, users read a Stop's text."""

    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed out"
    LOST = "lost"  # a remote worker's node or Ray worker went away
    SPEND_LIMIT = "spend limit reached"
    USAGE_LIMIT = "usage limit reached"  # a provider's quota, with a far reset (core/limits.py)
    DEPENDENCY_FAILED = "dependency failed"
    NOT_STARTED = "not started"
    DISK_FULL = (
        "disk full"  # the run stopped: a write of its ledger, git or a file met ENOSPC (run/diskfull.py)
    )


@dataclass(frozen=True)
class Stop:
    """A stop and the words it is shown and recorded with (the reason's own when there is no more to say)."""

    reason: StopReason
    text: str = ""

    def __str__(self) -> str:
        return self.text or self.reason.value


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as the executor, the ledger and the AttemptEnded event see it."""

    outcome: AttemptOutcome
    summary: str
    error: str | None = None
    stop: Stop | None = None  # why the worker was stopped (None: it ended by itself, or never started)
    exit_code: int | None = None  # negative: killed by that signal
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None
    claimed_usd: float = 0.0  # what the worker's result says it spent (settled against the ledger's tally)
    facts: Mapping[str, Any] = field(default_factory=dict)  # what its result file says it learned

    @classmethod
    def failed(cls, text: str) -> AttemptEnd:
        return cls(AttemptOutcome.FAILED, text, text)

    @property
    def reason(self) -> str | None:
        """Why the task did not succeed (None: it did)."""
        return None if self.outcome == AttemptOutcome.SUCCEEDED else (self.error or self.summary)

    def plus_cpu(self, seconds: float) -> AttemptEnd:
        """This end with seconds more CPU (its setup's: part of what the attempt cost the machine)."""
        return replace(self, cpu_seconds=(self.cpu_seconds or 0.0) + seconds) if seconds else self

    def stalled(self, evidence: str) -> AttemptEnd:
        """The end of a worker the watchdog stopped: `stalled`, the evidence as summary and reason."""
        if self.outcome == AttemptOutcome.SUCCEEDED:  # it finished just as it was stopped
            return self
        return replace(self, outcome=AttemptOutcome.STALLED, summary=evidence, error=evidence)


def outcome_detail(outcome: str, summary: str | None, error: str | None) -> str:
    """What an attempt's end says: a success's summary; else the error, then the worker's own words."""
    if outcome == AttemptOutcome.SUCCEEDED or not error:
        return summary or ""
    if summary and summary != error and summary not in error:
        return f"{error}: {summary}"
    return error


class CheckPhase(StrEnum):
    """When a task's check ran: on its start commit, on its result, or on the integrated tree."""

    BEFORE = "before"  # check_fails_first: it must fail there
    AFTER = "after"
    MERGE = "merge"  # stella merge, before it lands the task's branch


class FollowUpReason(StrEnum):
    """Why a task is asked for another attempt (a row of the ledger's `requests`)."""

    CHECK = "check"  # its check was red: the next round gets the check's output
    LIMIT = "limit"  # a provider limit ended it: again once the limit is over
    CI_FIX = "ci-fix"  # its branch's CI went red: the failing jobs' log
    RESOLVE = "resolve"  # its branch conflicts with the target of `stella merge`: the conflict
    STALE = "stale"  # a parent's branch moved and its own work no longer replays onto it
    EVICTED = "evicted"  # a merge train took its branch out of a batch
    ANSWER = "answer"  # a person answered what it asked
    RETRY = "retry"  # it failed and nothing is left to try without a person (`stella fleet --resume`)


class RequestState(StrEnum):
    """A follow-up request: `open` until one process takes it; `needs_you` waits on a person."""

    OPEN = "open"
    SERVED = "served"
    NEEDS_YOU = "needs_you"
    ANSWERED = "answered"  # a person answered it (`stella answer`): the task's next attempt takes it
    DISMISSED = "dismissed"


class MergeStatus(StrEnum):
    """One branch's step through `stella merge`."""

    PLANNED = "planned"
    MERGED = "merged"
    CONFLICT = "conflict"
    CHECK_FAILED = "check_failed"
    SKIPPED = "skipped"
    ERROR = "error"


class CIState(StrEnum):
    """A watched branch: `pending` until CI settles it, then one of the others."""

    PENDING = "pending"
    GREEN = "green"
    RED = "red"
    STALLED = "stalled"
    NO_CI = "no_ci"
    ERROR = "error"

    @property
    def settled(self) -> bool:
        return self is not CIState.PENDING
