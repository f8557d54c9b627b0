"""The barrier of an expanding task in doit's graph (waves.PlanRunner with run/expand.py), in process: the
emitted tasks come up through doit's delayed task creation, in order, under the width, and the emitter's
dependents wait for all of them. Workers are stood in for by a function (the fleet tests run real ones)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask, plan_from_data
from stellafleet.run.expand import Expansions
from stellafleet.run.waves import PlanRunner, barrier
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

PLAN = {
    "tasks": [
        {"id": "survey", "prompt": "p"},
        {"id": "split", "prompt": "p", "depends_on": ["survey"], "expands": True},
        {"id": "integrate", "prompt": "p", "depends_on": ["split"]},
        {"id": "aside", "prompt": "p"},
    ]
}

FRAGMENTS = {
    "split": """
[[tasks]]
id = "a"
prompt = "p"
depends_on = ["survey"]

[[tasks]]
id = "b"
prompt = "p"
depends_on = ["a"]
expands = true

[[tasks]]
id = "c"
prompt = "p"
""",
    "split.b": """
[[tasks]]
id = "leaf"
prompt = "p"
""",
}


class Fleet:
    """Stands in for the dispatcher: each task 'runs' by writing its fragment (if it has one) and settling
    it as the dispatcher does; `fail` names tasks that fail."""

    def __init__(self, tmp_path: Path, plan, *, fail: tuple[str, ...] = ()) -> None:
        self.dir = tmp_path
        self.ledger = Ledger.open(tmp_path / "fleet.db")
        add_run(self.ledger, "r-1")
        self.ledger.tasks.add("r-1", plan.tasks, {})
        self.expansions = Expansions(plan, self.ledger, "r-1", max_emitted=50, max_depth=3)
        self.fail = fail
        self.order: list[str] = []
        self.running = 0
        self.widest = 0
        self._lock = threading.Lock()

    def execute(self, task: PlanTask) -> bool:
        with self._lock:
            self.order.append(task.id)
            self.running += 1
            self.widest = max(self.widest, self.running)
        try:
            if task.id in self.fail:
                return False
            end = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")
            if task.expands:
                out = self.dir / f"{task.id}.plan"
                if task.id in FRAGMENTS:
                    out.write_text(FRAGMENTS[task.id])
                end = self.expansions.settle(task, out, end)
            return end.reason is None
        finally:
            with self._lock:
                self.running -= 1


@pytest.mark.parametrize("schedule", ["waves", "eager"])
def test_emitted_tasks_run_in_order_and_the_emitter_is_a_barrier(tmp_path: Path, schedule: str) -> None:
    plan = plan_from_data(PLAN)
    fleet = Fleet(tmp_path, plan)
    events: list = []
    runner = PlanRunner(
        plan, 2, fleet.execute, schedule=schedule, expansions=fleet.expansions, on_event=events.append
    )
    seen = runner.run()
    order = fleet.order
    emitted = ["split.a", "split.b", "split.c", "split.b.leaf"]
    assert sorted(order) == sorted(["survey", "split", "integrate", "aside", *emitted])
    for before, after in [
        ("survey", "split"),
        ("split", "split.a"),
        ("split", "split.c"),
        ("split.a", "split.b"),
        ("split.b", "split.b.leaf"),
        *((task_id, "integrate") for task_id in emitted),
    ]:
        assert order.index(before) < order.index(after), (before, after)
    assert fleet.widest <= 2
    assert all(status == "succeeded" for status in seen.statuses.values())
    assert barrier("split") not in seen.statuses and len(seen.statuses) == 8
    assert [(e.parent, e.tasks) for e in events if type(e).__name__ == "TasksEmitted"] == [
        ("split", ("split.a", "split.b", "split.c")),
        ("split.b", ("split.b.leaf",)),
    ]
    if schedule == "waves":  # a barrier takes no wave of its own
        assert all(not task_id.endswith(":emitted") for wave in runner.waves for task_id in wave)


def test_a_failed_emitted_task_skips_the_emitters_dependents_naming_it(tmp_path: Path) -> None:
    plan = plan_from_data(PLAN)
    fleet = Fleet(tmp_path, plan, fail=("split.a",))
    seen = PlanRunner(plan, 2, fleet.execute, expansions=fleet.expansions).run()
    assert seen.statuses["split.a"] == "failed"
    assert seen.reasons["split.b"] == "dependency failed: split.a"
    assert seen.reasons["integrate"] == "dependency failed: split.a"
    assert seen.statuses["split.c"] == "succeeded" and seen.statuses["aside"] == "succeeded"
    assert "split.b.leaf" not in fleet.order


def test_a_failed_emitter_emits_nothing_and_its_dependents_are_skipped(tmp_path: Path) -> None:
    plan = plan_from_data(PLAN)
    fleet = Fleet(tmp_path, plan, fail=("split",))
    seen = PlanRunner(plan, 1, fleet.execute, expansions=fleet.expansions).run()
    assert seen.reasons["integrate"] == "dependency failed: split"
    assert sorted(fleet.order) == ["aside", "split", "survey"]


def test_a_resumed_emitter_brings_back_its_tasks_and_only_what_is_left_runs(tmp_path: Path) -> None:
    plan = plan_from_data(PLAN)
    emitted = (
        PlanTask("split.a", "p", "a", depends_on=("survey",), parent="split"),
        PlanTask("split.c", "p", "c", parent="split"),
    )
    fleet = Fleet(tmp_path, plan)
    fleet.expansions = Expansions(plan, fleet.ledger, "r-1", max_emitted=50, max_depth=3, emitted=emitted)
    done = frozenset({"survey", "split", "split.a"})
    seen = PlanRunner(plan, 2, fleet.execute, expansions=fleet.expansions, done=done).run()
    assert sorted(fleet.order) == ["aside", "integrate", "split.c"]
    assert fleet.order.index("split.c") < fleet.order.index("integrate")
    assert seen.statuses["split.a"] == "succeeded"


def test_under_ray_an_emitted_isolated_task_may_not_expand(tmp_path: Path) -> None:
    """Its worker would run on a node, where the fragment it writes stays: refused like the plan file's."""
    plan = plan_from_data(PLAN)
    ledger = Ledger.open(tmp_path / "fleet.db")
    add_run(ledger, "r-1")
    ledger.tasks.add("r-1", plan.tasks, {})
    fragment = tmp_path / "split.plan"
    fragment.write_text('[[tasks]]\nid = "far"\nprompt = "p"\nisolation = "isolated"\nexpands = true\n')
    split = next(task for task in plan.tasks if task.id == "split")
    succeeded = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")
    here = Expansions(plan, ledger, "r-1", max_emitted=50, max_depth=3)
    remote = Expansions(plan, ledger, "r-1", max_emitted=50, max_depth=3, isolated_remote=True)
    end = remote.settle(split, fragment, succeeded)
    assert end.outcome == AttemptOutcome.FAILED
    assert 'task "split.far": expands: an isolated task runs on the Ray cluster' in (end.reason or "")
    assert remote.children("split") == ()
    assert here.settle(split, fragment, succeeded).reason is None  # the local executor: it may
    assert [task.id for task in here.children("split")] == ["split.far"]
