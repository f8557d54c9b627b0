"""The eager schedule's order (`make -j`-like: the longest waiting chain first), and its lower bound."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from stellafleet.plan.model import Plan

SCHEDULES = ("waves", "eager")


def chain_times(plan: Plan, durations: Mapping[str, float]) -> dict[str, float]:
    """Task id -> the longest time from its start to the end of a chain through its dependents."""
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


def start_order(plan: Plan, durations: Mapping[str, float]) -> dict[str, tuple[float, float, int]]:
    """Task id -> its rank among ready tasks (lowest first): longest timed chain, chain in tasks, order."""
    times, heights = chain_times(plan, durations), chain_times(plan, {})  # unknown: one unit per task
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
