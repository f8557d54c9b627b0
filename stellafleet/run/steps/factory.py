"""The one place a run's attempts are put together, for `stella fleet`, `merge --resolve` and `--fix-ci`:
the steps, the Dispatcher on them and the request server on that."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendBudget
from stellafleet.plan.model import PlanTask
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.events import Emit
from stellafleet.run.executor import Executor
from stellafleet.run.expand import Expansions
from stellafleet.run.limiter import Limiter
from stellafleet.run.serve import Server
from stellafleet.run.steps import AttemptStep, RunSettings
from stellafleet.run.steps.check import Check
from stellafleet.run.steps.claims import Claims
from stellafleet.run.steps.commitrefusal import CommitRefusal
from stellafleet.run.steps.commits import BranchCommits, RequiredCommits
from stellafleet.run.steps.expansions import Expand
from stellafleet.run.steps.gitguard import GitGuard
from stellafleet.run.steps.leases import Leases
from stellafleet.run.steps.limits import LimitGate
from stellafleet.run.steps.park import Park
from stellafleet.run.steps.salvage import Salvage
from stellafleet.run.steps.sessions import Sessions
from stellafleet.run.steps.spend import SpendGuard
from stellafleet.run.steps.startcommit import StartCommit
from stellafleet.run.steps.unclaimed import UnclaimedWrites
from stellafleet.run.steps.watch import Watch
from stellafleet.run.steps.workspace import Workspaces
from stellafleet.run.watchdog import Watchdog
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

MIXED_PIPELINES = "mixed"  # runs.pipeline of a run whose tasks use more than one pipeline

# the steps in their order (released in the reverse one); prepare asks their preflight in it too
STEPS: tuple[type[AttemptStep], ...] = (
    LimitGate,  # released last: after the guard is free
    SpendGuard,
    Park,  # a task still waiting on its answer takes nothing; a parked end is told before salvage's
    Claims,
    StartCommit,  # before the worktree: parents that conflict are refused first
    Leases,  # before the worktree: its setup sees the ports; no worktree is made while its locks are awaited
    Workspaces,
    Sessions,  # a follow-up's session: continued, or new and why
    GitGuard,
    CommitRefusal,  # before UnclaimedWrites, which adds to the reason
    UnclaimedWrites,
    Watch,
    Check,  # after the watchdog forgot the worker; before salvage sees a red check
    RequiredCommits,  # before salvage sees a task that made no commit
    Salvage,  # after the watchdog: a stalled attempt's salvage says so
    BranchCommits,
    Expand,
)


def recorded_default_pipeline(run: Mapping[str, object], config: Config) -> str:
    """The pipeline a follow-up of a recorded run runs with: the run's one pipeline, else the config's."""
    pipeline = run.get("pipeline")
    return str(pipeline) if pipeline and pipeline != MIXED_PIPELINES else config.fleet.pipeline


def recorded_task(row: Mapping[str, Any], *, with_check: bool = True) -> PlanTask:
    """A recorded task (its ledger row) as a follow-up outside its fleet runs it: in its own worktree, with
    the plan fields the ledger keeps (its check, unless with_check is False)."""
    return PlanTask(
        id=row["id"],
        prompt=row.get("prompt") or "",
        title=row.get("title") or row["id"],
        isolation="isolated",
        pipeline=row.get("pipeline"),
        model=row.get("model"),
        timeout=row.get("timeout_s"),
        check=row.get("check_command") if with_check else None,
    )


def server(
    settings: RunSettings,
    ledger: Ledger,
    claims: ClaimStore,
    executor: Executor,
    emit: Emit,
    *,
    budget: SpendBudget | None = None,
    limiter: Limiter | None = None,
    expansions: Expansions | None = None,
    watchdog: Watchdog | None = None,
) -> Server:
    """The run's request server on its Dispatcher and steps, in their order (released in the reverse one)."""
    steps: list[AttemptStep | None] = [
        LimitGate(limiter) if limiter is not None else None,
        SpendGuard(ledger, budget, settings.spend_guard_usd),
        Park(settings, ledger),
        Claims(claims, settings.root),
        StartCommit(settings, ledger),
        Leases(settings, ledger, emit),
        Workspaces(settings, ledger, emit),
        Sessions(settings, ledger),
        GitGuard(settings),
        CommitRefusal(ledger),
        UnclaimedWrites(settings, ledger, claims),
        Watch(watchdog) if watchdog is not None else None,
        Check(settings, ledger),
        RequiredCommits(ledger) if settings.config.fleet.require_commits else None,
        Salvage(ledger, claims),
        BranchCommits(ledger),
        Expand(expansions) if expansions is not None else None,
    ]
    made = [step for step in steps if step is not None]
    return Server(
        Dispatcher(settings, ledger, executor, emit, sorted(made, key=lambda s: STEPS.index(type(s))))
    )
