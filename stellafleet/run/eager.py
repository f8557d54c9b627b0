"""The eager schedule: a task starts as soon as its dependencies have succeeded and a worker slot is free.

Like `make -j`: the same doit task graph and the same rules as the waves (a failed task's dependents are
skipped, a stop launches nothing more, at most `max_concurrency` workers at once), but no task waits for
an unrelated slow one. The check run before each wave (the spend limit) runs before each task instead:
once it says stop, no new task starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from stellafleet.plan.model import Plan
from stellafleet.run.events import TaskStarted
from stellafleet.run.waves import WaveRunner

SCHEDULES = ("waves", "eager")


class EagerRunner(WaveRunner):
    """Runs a plan through doit's TaskDispatcher, starting ready tasks as soon as one of `max_concurrency`
    slots is free: first the one with the longest chain of work still waiting on it, then in plan order
    (start_order). `before_wave(n, [task])` is asked before the n-th task starts."""

    durations: Mapping[str, float] = {}  # task id -> seconds an earlier run of it took (the ledger's)

    def run(self) -> Any:
        self._first = start_order(self.plan, self.durations)
        return super().run()

    def run_tasks(self, task_dispatcher: Any) -> None:
        self._dispatcher = task_dispatcher
        self._ready: dict[str, Any] = {}
        self._finished: list[Any] = []
        self._started = 0
        running: dict[Future[Any], Any] = {}
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="stella-eager") as pool:
            self._pull()
            while self._ready or running:
                self._launch(pool, running)
                if running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in sorted(finished, key=lambda f: self._order[running[f].task.name]):
                        node = running.pop(future)
                        self._conclude(node, future)
                        self._finished.append(node)
                self._pull()
        self.outcome.stopped = self._current_stop()

    def _launch(self, pool: ThreadPoolExecutor, running: dict[Future[Any], Any]) -> None:
        """Start ready tasks, first in plan order, while a slot is free; on a stop, skip every ready one."""
        while self._ready and len(running) < self.max_concurrency:
            task_id = min(self._ready, key=self._first.__getitem__)
            reason = self._stop_before(self._started + 1, [task_id])
            if reason is not None:
                self._skip_ready(reason)
                return
            node = self._ready.pop(task_id)
            self._started += 1
            self.outcome.waves.append([task_id])  # eager: each start is its own step
            self._emit(TaskStarted(task_id, self._started))
            running[pool.submit(self.execute_task, node.task)] = node


def chain_times(plan: Plan, durations: Mapping[str, float]) -> dict[str, float]:
    """Task id -> the longest time from its start to the end of a chain through its dependents, each task
    taking its duration in `durations`. A task without one takes the median of those given, and with
    none given every task takes 1: then the time is the number of tasks on the chain."""
    known = sorted(durations[task_id] for task_id in plan.ids if task_id in durations)
    middle = len(known) // 2  # the median, without importing statistics (a tenth of the fleet's imports)
    guess = (known[middle] + known[~middle]) / 2 if known else 1.0
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


def runner_class(schedule: str) -> type[WaveRunner]:
    """The runner of a schedule name ("waves" or "eager")."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    return EagerRunner if schedule == "eager" else WaveRunner


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
