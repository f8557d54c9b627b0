"""What a fleet run tells as it works: one frozen dataclass per event, and the base of their sinks."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from stellafleet.core.status import AttemptEnd, Stop, TaskStatus


class TaskParked(Exception):
    """Raised by a task's action whose attempt parked (it waits on a person): its dependents wait too."""


@dataclass(frozen=True)
class RunStarted:
    """The run and its tasks are recorded; its waves start next."""

    run_id: str
    concurrency: str  # how many workers at once, and why (e.g. "max concurrency 2 (--max-concurrency)")
    base_ref: str
    base_commit: str
    tasks: tuple[str, ...]
    waves: tuple[tuple[str, ...], ...]
    spend_limit_usd: float | None
    spend_guard_usd: float | None
    schedule: str = "waves"  # or "eager": then no WaveStarted comes
    grows: bool = False  # a task expands at run time: more waves come for what it emits
    done_in: str | None = None  # --resume: the run whose done tasks are in no wave of this one


@dataclass(frozen=True)
class WaveStarted:
    wave: int  # from 1
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class WaveEnded:
    wave: int


@dataclass(frozen=True)
class TaskStarted:
    """doit started the task's action (its attempt starts next)."""

    task: str
    wave: int


@dataclass(frozen=True)
class TaskEnded:
    """doit's verdict on a task that ran: succeeded or failed."""

    task: str
    status: TaskStatus
    reason: str | None


@dataclass(frozen=True)
class TasksEmitted:
    """An expanding task succeeded and its fragment's tasks joined the run (expand.py)."""

    parent: str
    tasks: tuple[str, ...]


class SkipTask(Exception):
    """Raised by a task's action to skip it rather than fail, and stop the run (no spend guard left)."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(str(stop))
        self.stop = stop


@dataclass(frozen=True)
class TaskSkipped:
    """A task that will not run (a dependency failed, the run was stopped)."""

    task: str
    reason: str


@dataclass(frozen=True)
class AttemptStarted:
    """A task's worker is running."""

    task: str
    title: str
    pid: int | None
    branch: str | None  # only for isolated tasks
    log_path: Path
    result_path: Path


@dataclass(frozen=True)
class AttemptEnded:
    """A task's attempt is over and recorded."""

    task: str
    attempt: int
    end: AttemptEnd
    elapsed_s: float
    spend_usd: float


@dataclass(frozen=True)
class SetupStarted:
    """A new worktree's `[worktree] setup` started; its worker starts once it is done."""

    task: str
    log_path: Path


@dataclass(frozen=True)
class LockWaiting:
    """A task waits for a named lock another task holds (or waits for first); it starts once it has them."""

    task: str
    lock: str
    held_by: str  # the other task, as the live view names it
    waiting: bool = False  # held_by does not hold it yet: it waited longer and goes first

    def describe(self) -> str:
        how = "first in line" if self.waiting else "held by"
        return f"waiting for lock {self.lock} ({how} {self.held_by})"


@dataclass(frozen=True)
class Notice:
    """Something the user should know now (an interrupt was heard)."""

    text: str


Event: TypeAlias = (
    RunStarted
    | WaveStarted
    | WaveEnded
    | TaskStarted
    | TaskEnded
    | TaskSkipped
    | TasksEmitted
    | AttemptStarted
    | AttemptEnded
    | SetupStarted
    | LockWaiting
    | Notice
)
Emit = Callable[[Event], None]


class EventSink:
    """A reporter's plumbing: serialises events from many threads onto its on_<event> methods, if defined
    (RunStarted: on_run_started)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def handle(self, event: Event) -> None:
        handler = getattr(self, _handler_name(type(event).__name__), None)
        if handler is not None:
            with self._lock:
                handler(event)

    def finish(self, doc: Mapping[str, Any]) -> None:
        """The run's result document (reporter.py's result_document), once it is over."""

    def abort(self) -> None:
        """Give back what the sink holds when the run ends without a result (after finish: nothing)."""


@functools.cache
def _handler_name(event_name: str) -> str:
    """`on_run_started` for RunStarted."""
    return "on_" + re.sub(r"(?<=[a-z])(?=[A-Z])", "_", event_name).lower()
