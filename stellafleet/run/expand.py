"""Plans that grow: what the run's expanding tasks (`expands = true`) have added to it (docs/plans.md).
Emitted tasks are recorded before their parent succeeds: a killed fleet leaves the parent or its tasks."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from stellafleet.core.errors import PlanError
from stellafleet.core.status import AttemptEnd
from stellafleet.plan.fragment import FragmentRules, fragment_name, load_fragment, visible_to
from stellafleet.plan.model import Plan, PlanTask
from stellafleet.state.ledger import Ledger


class Expansions:
    """The run's tasks, the plan's and those emitted so far; `settle` is thread-safe."""

    def __init__(
        self,
        plan: Plan,
        ledger: Ledger,
        run_id: str,
        *,
        max_emitted: int,
        max_depth: int,
        emitted: Iterable[PlanTask] = (),
        isolated_remote: bool = False,
    ) -> None:
        self.ledger = ledger
        self.plan_defaults = plan.defaults
        # on the Ray cluster an emitted isolated task may not expand: its fragment would stay on a node
        self.isolated_remote = isolated_remote
        self.run_id = run_id
        self.max_emitted = max_emitted
        self.max_depth = max_depth
        seeded = tuple(emitted)  # what an earlier run's expanding tasks emitted (--resume)
        self.tasks: dict[str, PlanTask] = {task.id: task for task in (*plan.tasks, *seeded)}
        self.count = len(seeded)  # tasks emitted in this run and the one it resumes
        self._lock = threading.Lock()

    def children(self, task_id: str) -> tuple[PlanTask, ...]:
        """What task_id emitted, in its fragment's order (nothing: it failed, emitted none or is unknown)."""
        with self._lock:
            return tuple(task for task in self.tasks.values() if task.parent == task_id)

    def depth(self, task_id: str) -> int:
        """0 for a plan task, 1 for what one emitted, and so on."""
        depth, task = 0, self.tasks.get(task_id)
        while task is not None and task.parent is not None:
            depth, task = depth + 1, self.tasks.get(task.parent)
        return depth

    def settle(self, task: PlanTask, plan_out: Path | None, end: AttemptEnd) -> AttemptEnd:
        """The end to record for an expanding task's succeeded attempt: its fragment's tasks recorded, or
        a failed end naming every problem of the fragment (nothing of it runs)."""
        if plan_out is None:
            return end
        with self._lock:
            rules = FragmentRules(
                visible=visible_to(task, self.tasks),
                depth=self.depth(task.id) + 1,
                max_depth=self.max_depth,
                emitted_before=self.count,
                max_emitted=self.max_emitted,
                plan_defaults=self.plan_defaults,
            )
            try:
                emitted = load_fragment(plan_out, task, rules)
                self._refuse(task.id, emitted)
            except PlanError as exc:
                many = f" ({len(exc.problems)} problems)" if len(exc.problems) != 1 else ""
                return AttemptEnd.failed(f"its plan fragment was refused{many}: " + "; ".join(exc.problems))
            self.ledger.tasks.add(self.run_id, emitted, {})
            self.ledger.tasks.set_fragment(self.run_id, task.id, str(plan_out))
            for child in emitted:
                self.tasks[child.id] = child
            self.count += len(emitted)
        said = f"emitted {len(emitted)} tasks"
        return replace(end, summary=f"{end.summary} ({said})") if emitted and said not in end.summary else end

    def _refuse(self, emitter: str, emitted: Iterable[PlanTask]) -> None:
        """An emitted task's full id must not be one the run has; under Ray an isolated one may not expand."""
        name = fragment_name(emitter)
        problems = [
            f'{name}: task "{t.id}": id: the run already has a task "{t.id}"'
            for t in emitted
            if t.id in self.tasks
        ]
        if self.isolated_remote and not problems:
            problems = [
                f'{name}: task "{t.id}": expands: an isolated task runs on the Ray cluster, where what it '
                "emits would stay on the node: make it shared, or leave expands out"
                for t in emitted
                if t.expands and t.isolation == "isolated"
            ]
        if problems:
            raise PlanError(problems)
