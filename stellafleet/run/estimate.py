"""`stella fleet --plan FILE --estimate`: a run's likely cost and time, from the ledger's history."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import IO, Any

from stellafleet.core import jsontext
from stellafleet.core.spend import money, spend_range, total_spend, where_limit_stops
from stellafleet.core.words import duration_text, plural
from stellafleet.plan.model import Plan
from stellafleet.run.eager import start_order
from stellafleet.run.prepare import Prepared
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_attempts import Past

SAME_TASK = "the same task"
SAME_KIND = "tasks of the same pipeline and model"


@dataclass(frozen=True)
class TaskEstimate:
    task_id: str
    pipeline: str
    model: str | None
    basis: str | None  # SAME_TASK, SAME_KIND, or None: never run
    attempts: int
    usd: tuple[float, float] | None  # (median, 90th percentile)
    seconds: tuple[float, float] | None  # the whole attempt's, its setup included
    # its history's `[worktree] setup` apart from the work after it (None: no setup in its history)
    setup: tuple[tuple[float, float], tuple[float, float]] | None = None

    def to_json(self) -> dict[str, Any]:
        shown = {
            "task": self.task_id,
            **{key: getattr(self, key) for key in ("pipeline", "model", "basis", "attempts")},
            "spend_usd": _pair(self.usd),
            "duration_s": _pair(self.seconds),
        }
        if self.setup is not None:
            shown |= {"setup_s": _pair(self.setup[0]), "work_s": _pair(self.setup[1])}
        return shown


def _pair(value: tuple[Any, Any] | None) -> dict[str, Any] | None:
    return None if value is None else {"median": value[0], "p90": value[1]}


def task_estimate(
    ledger: Ledger, task_id: str, prompt: str, pipeline: str, model: str | None
) -> TaskEstimate:
    past: list[Past] = ledger.history.same_task(task_id, prompt, pipeline)
    basis: str | None = SAME_TASK
    if not past:
        past, basis = ledger.history.same_kind(pipeline, model), SAME_KIND
    if not past:
        return TaskEstimate(task_id, pipeline, model, None, 0, None, None)
    usd, seconds = spend_range(p.usd for p in past), spend_range(p.seconds for p in past)
    setups = [p.setup_seconds for p in past if p.setup_seconds is not None]
    setup = None
    if setups:  # the work: what each attempt took after its setup
        work = spend_range(max(0.0, p.seconds - (p.setup_seconds or 0.0)) for p in past)
        setup = (spend_range(setups), work)
    return TaskEstimate(task_id, pipeline, model, basis, len(past), usd, seconds, setup)


def play(plan: Plan, seconds: dict[str, float], width: int, schedule: str) -> tuple[float, list[str]]:
    """(wall time, start order) of the plan with these durations through the schedule at this width."""
    if schedule == "waves":
        waves = plan.waves(width)
        order = [t for w in waves for t in w]
        return sum(max((seconds[t] for t in wave), default=0.0) for wave in waves), order
    rank = start_order(plan, seconds)
    waiting = {task.id: set(task.depends_on) for task in plan.tasks}
    running: list[tuple[float, str]] = []
    now, order = 0.0, []
    while waiting or running:
        ready = sorted((t for t, deps in waiting.items() if not deps), key=rank.__getitem__)
        for task_id in ready[: max(0, width - len(running))]:
            del waiting[task_id]
            order.append(task_id)
            heapq.heappush(running, (now + seconds[task_id], task_id))
        if not running:
            break  # what is left waits on nothing that runs: cannot happen in a checked plan
        now, done = heapq.heappop(running)
        for deps in waiting.values():
            deps.discard(done)
    return now, order


@dataclass(frozen=True)
class Estimate:
    plan: str
    schedule: str
    concurrency: int
    tasks: list[TaskEstimate]
    wall_s: tuple[float, float]
    spend_limit: float | None
    stops_at: tuple[str | None, str | None]  # (at the median, at the 90th percentile)

    @property
    def known(self) -> list[TaskEstimate]:
        return [task for task in self.tasks if task.basis is not None]

    def total_usd(self) -> tuple[float, float]:
        return total_spend([t.usd for t in self.known if t.usd is not None])

    def to_json(self) -> dict[str, Any]:
        known = bool(self.known)
        return {
            "plan": self.plan,
            "schedule": self.schedule,
            "max_concurrency": self.concurrency,
            "history": known,
            "tasks": [task.to_json() for task in self.tasks],
            "without_history": [task.task_id for task in self.tasks if task.basis is None],
            "total_spend_usd": _pair(self.total_usd()) if known else None,
            "wall_time_s": _pair(self.wall_s) if known else None,
            "spend_limit_usd": self.spend_limit,
            "likely_stops_at": _pair(self.stops_at) if self.spend_limit is not None and known else None,
        }


def estimate(prepared: Prepared, ledger: Ledger) -> Estimate:
    """The estimate of the prepared run from the ledger's history (nothing is written)."""
    p = prepared
    tasks = [
        task_estimate(ledger, t.id, t.prompt, t.pipeline or p.default_pipeline, t.model or p.options.model)
        for t in p.plan.tasks
    ]
    width = p.concurrency.value
    by_id = {t.task_id: t for t in tasks}
    walls: list[float] = []
    stops: list[str | None] = []
    for index in (0, 1):  # the median, then the 90th percentile
        seconds = {t.task_id: t.seconds[index] if t.seconds else 0.0 for t in tasks}
        wall, order = play(p.plan, seconds, width, p.schedule)
        walls.append(wall)
        expected = [(tid, u[index]) for tid in order if (u := by_id[tid].usd) is not None]
        stops.append(None if p.spend_limit is None else where_limit_stops(expected, p.spend_limit))
    source = str(p.plan_path) if p.plan_path else "the prompts"
    return Estimate(
        source, p.schedule, width, tasks, (walls[0], walls[1]), p.spend_limit, (stops[0], stops[1])
    )


def print_estimate(found: Estimate, *, json_mode: bool, stream: IO[str]) -> None:
    lines = [jsontext.dumps(found.to_json())] if json_mode else estimate_lines(found)
    stream.write("".join(line + "\n" for line in lines))


def _range_text(seconds: tuple[float, float]) -> str:
    return f"{duration_text(seconds[0])} / {duration_text(seconds[1])}"


def estimate_lines(found: Estimate) -> list[str]:
    shape = f"{len(found.tasks)} tasks, {found.schedule}, max concurrency {found.concurrency}"
    head = f"estimate for {found.plan}: {shape}"
    if not found.known:
        return [
            head,
            "no estimate: none of these tasks, nor any task of the same pipeline and model, has run before "
            "(the ledger has no history to estimate from); nothing is guessed",
        ]
    lines = [head + ", from the ledger's history (median / 90th percentile):"]
    for t in found.tasks:
        if t.usd is None or t.seconds is None:
            lines.append(f"  {t.task_id}: no history ({t.pipeline}, model {t.model or 'default'}): left out")
            continue
        apart = ""
        if t.setup is not None:
            apart = f" (setup {_range_text(t.setup[0])}, work {_range_text(t.setup[1])})"
        lines.append(
            f"  {t.task_id}: {money(t.usd[0])} / {money(t.usd[1])}, {_range_text(t.seconds)}{apart}"
            f"  (from {t.basis}: {plural(t.attempts, 'attempt')})"
        )
    total = found.total_usd()
    missing = len(found.tasks) - len(found.known)
    left_out = f" ({plural(missing, 'task')} without history left out)" if missing else ""
    lines.append(f"total: {money(total[0])} / {money(total[1])}{left_out}")
    lines.append(
        f"wall time: {duration_text(found.wall_s[0])} / {duration_text(found.wall_s[1])}"
        f" through the {found.schedule} schedule"
    )
    if found.spend_limit is not None:
        median, p90 = found.stops_at
        if median is None and p90 is None:
            said = "likely not reached"
        elif median is None:
            said = f"not reached at the median; at the 90th percentile it stops at {p90}"
        else:
            said = f"likely stops the run at task {median} (90th percentile: at {p90})"
        lines.append(f"spend limit {money(found.spend_limit)}: {said}")
    return lines
