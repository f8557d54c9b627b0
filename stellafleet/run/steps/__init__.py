"""The attempt's steps: each feature around one attempt is an AttemptStep in a module of its own.
dispatch.py calls the hooks in the steps' order, then `released` in reverse, for each step admitted;
prepare.py asks every step's `preflight` before the run, in the same order."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stellafleet.core.config import Config
from stellafleet.core.errors import GitError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, FollowUpReason
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import hookstash
from stellafleet.git.worktrees import isolated_name
from stellafleet.plan.model import Plan, PlanTask
from stellafleet.run.executor import Execution


@dataclass(frozen=True)
class RunSettings:
    """What every attempt of one run shares; what the config says about attempts is read from config."""

    root: Path
    run_id: str
    base_commit: str
    default_pipeline: str
    default_model: str | None = None  # for tasks that name no model (None: the pipeline's own default)
    spend_guard_usd: float | None = None
    config_file: Path | None = None
    config: Config = field(default_factory=Config)
    allow_detached: bool = False  # --allow-detached: shared commits may go onto a detached HEAD
    # task id -> the commit its new worktree starts from, instead of base_commit (--from-salvage)
    start_points: Mapping[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)

    @functools.cached_property
    def serialize_hooks(self) -> bool:
        """Whether the run's commit hooks run one commit at a time (`[commit] serialize_hooks`)."""
        try:
            return hookstash.serialised(self.config.commit.serialize_hooks, self.root)
        except GitError:  # no repository to read hooks from (a test's bare settings)
            return False


@dataclass(frozen=True)
class Workspace:
    path: Path
    branch: str | None  # only for isolated tasks

    @property
    def isolated(self) -> bool:
        return self.branch is not None


def workspace_for(root: Path, run_id: str, task: PlanTask) -> Workspace:
    """The repository root for shared tasks; `.stella/worktrees/<slug>-<hash>` on `fleet/...` otherwise."""
    if task.isolation != "isolated":
        return Workspace(root, None)
    name = isolated_name(run_id, task.id)
    return Workspace(StatePaths(root).worktrees / name, f"fleet/{name}")


@dataclass(frozen=True)
class FollowUp:
    """Another attempt of this task, asked for by a step as its attempt is released: the server records it
    as a ledger request and serves it (run/serve.py), or leaves it to a person (needs_you)."""

    reason: FollowUpReason
    context: str = ""  # what the next attempt's prompt carries after the task's own
    start_at: str | None = None  # None: in the task's workspace as it is; a commit: a fresh one there
    not_before_ms: int | None = None  # a limit's reset: it was not served before
    needs_you: bool = False  # no one may serve it without a person


@dataclass(frozen=True)
class Request:
    """A follow-up request taken to be served: its ledger row's id and what it asks."""

    id: int
    follow_up: FollowUp


@dataclass(frozen=True)
class BeforeRun:
    """What the steps' preflight is told: the run as prepared, nothing written yet."""

    root: Path
    plan: Plan
    config: Config
    changed: tuple[str, ...] = ()  # the user's uncommitted changes in the shared tree (none: all isolated)
    remote: bool = False  # isolated tasks run on a Ray cluster
    dry_run: bool = False
    allow_dirty: bool = False  # --allow-dirty: claimed files may have the user's changes


@dataclass(frozen=True)
class Preflight:
    """What a step finds before a run: `problems` keep it from starting (exit 2; a dry run lists them
    first), a `refusal` stops even a dry run (exit 2), `warnings` and `notes` are said as it starts, and
    `preview` is what the step adds to the --dry-run document."""

    problems: tuple[str, ...] = ()
    refusal: str | None = None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    preview: Mapping[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class AttemptState:
    """One attempt as its steps see it; the dispatcher fills it in as the attempt goes."""

    task: PlanTask
    stopping: threading.Event  # set once the run stops its workers
    request: Request | None = None  # the follow-up it serves; None: the task's own first attempt
    guard: float | None = None  # the worker's spend guard, decided on admission
    prompt: str = ""  # what the worker is told, decided on admission (the task's prompt by default)
    context: WorkerContext | None = None  # once the attempt's ledger row is open
    env: dict[str, str] = field(default_factory=dict)  # the worker's environment, before it starts
    remote: bool = False  # its worker runs on another machine (no worktree here)
    spend: float | None = None  # what the ledger recorded it spent, once finished
    recorded: AttemptEnd | None = None  # the end the ledger recorded

    @property
    def ctx(self) -> WorkerContext:
        assert self.context is not None, "the attempt is not open"
        return self.context

    @property
    def workspace(self) -> Workspace:
        return Workspace(self.ctx.workspace, self.ctx.branch)

    @property
    def reason(self) -> FollowUpReason | None:
        return self.request.follow_up.reason if self.request is not None else None

    @property
    def follow_up(self) -> bool:
        """A follow-up attempt runs in the task's existing workspace (unless its request starts afresh)."""
        return self.request is not None and self.request.follow_up.start_at is None


class AttemptFailed(Exception):
    """Raised by a step's before_start: the attempt ends so, and no worker starts."""

    def __init__(self, end: AttemptEnd) -> None:
        super().__init__(end.reason)
        self.end = end


class AttemptStep:
    """A feature around each attempt; every hook does nothing unless the step says otherwise."""

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """Before the run, nothing written (a class method: steps are built once the run has a ledger)."""
        return Preflight()

    def admit(self, attempt: AttemptState) -> None:
        """Before the attempt is recorded; SkipTask skips the task."""

    def before_start(self, attempt: AttemptState) -> None:
        """The attempt is open, its worker not started; AttemptFailed, ClaimConflict or StellaError end it."""

    def started(self, attempt: AttemptState, execution: Execution) -> None:
        """Its worker started."""

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """Its worker ended; the end to record."""
        return end

    def released(self, attempt: AttemptState) -> FollowUp | None:
        """The attempt is over (recorded, or failed before): always called, in reverse order; a FollowUp
        asks for another attempt of the task."""
        return None
