"""The eager schedule's order: a task starts as soon as its dependencies have succeeded and a slot is free.

Like `make -j`: the same doit task graph and the same rules as the waves (a failed task's dependents are
skipped, a stop launches nothing more, at most `max_concurrency` workers at once; waves.PlanRunner runs
both), but no task waits for an unrelated slow one. Of the ready tasks, the one with the longest chain of
work still waiting on it starts first; and the least wall time any schedule can reach, for the bench.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from stellafleet.plan.model import Plan

SCHEDULES = ("waves", "eager")


def chain_times(plan: Plan, durations: Mapping[str, float]) -> dict[str, float]:
    """Task id -> the longest time from its start to the end of a chain through its dependents, each task
    taking its duration in `durations`. A task without one takes the median of those given, and with
    none given every task takes 1: then the time is the number of tasks on the chain."""
    known = [durations[task_id] for task_id in plan.ids if task_id in durations]
    guess = statistics.median(known) if known else 1.0
    dependents: dict[str, list[str]] = {task_id: [] for task_id in plan.ids}
    for task in plan.tasks:
        for dep in task.depends_on:
            dependents[dep].append(task.id)
    times: dict[str, float] = {}
    for layer in reversed(plan.waves(max(len(plan.tasks), 1))):  # dependents first
        for task_id in layer:
            own = durations.get(task_id, guess)
            times[task_id] = own + max((times[d] for d in dependents[task_id]), default=0.0)
    return times


def chain_heights(plan: Plan) -> dict[str, int]:
    """Task id -> the number of tasks on the longest chain from it through its dependents (1: none)."""
    return {task_id: round(time) for task_id, time in chain_times(plan, {}).items()}


def start_order(plan: Plan, durations: Mapping[str, float]) -> dict[str, tuple[float, int, int]]:
    """Task id -> its rank among ready tasks (lowest starts first): the longest chain of work from it,
    timed by the durations earlier runs took where the ledger has them (a task's length in tasks stands
    in for its time where no duration is known), then the longest chain in tasks, then plan order."""
    times, heights = chain_times(plan, durations), chain_heights(plan)
    return {task_id: (-times[task_id], -heights[task_id], n) for n, task_id in enumerate(plan.ids)}


def critical_path(plan: Plan, durations: dict[str, float]) -> float:
    """The longest chain of durations through the plan's dependencies: no schedule finishes sooner."""
    finish: dict[str, float] = {}
    for layer in plan.waves(max(len(plan.tasks), 1)):  # every dependency comes before its dependents
        for task_id in layer:
            start = max((finish[dep] for dep in plan.task(task_id).depends_on), default=0.0)
            finish[task_id] = start + durations.get(task_id, 0.0)
    return max(finish.values(), default=0.0)


def lower_bound(plan: Plan, durations: dict[str, float], max_concurrency: int) -> float:
    """max(critical path, total work / concurrency): the least wall time any schedule can reach."""
    return max(critical_path(plan, durations), sum(durations.values()) / max_concurrency)
