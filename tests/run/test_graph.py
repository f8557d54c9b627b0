"""The plan as a doit graph: task dicts, doit's list/info views, and the PlanRunner on real threads."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stellafleet.core.status import Stop, StopReason
from stellafleet.plan.model import Plan, PlanTask, load_plan, plan_from_data
from stellafleet.run.events import Event, TaskEnded, TaskSkipped, TaskStarted, WaveEnded, WaveStarted
from stellafleet.run.waves import PlanRunner, compile_tasks, doit_view

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def buildout() -> Plan:
    return load_plan(EXAMPLES / "feature-buildout.toml")


def independent(*ids: str) -> Plan:
    return plan_from_data({"tasks": [{"id": task_id, "prompt": f"do {task_id}"} for task_id in ids]})


def chain_plan() -> Plan:
    return plan_from_data(
        {
            "tasks": [
                {"id": "a", "prompt": "p"},
                {"id": "b", "prompt": "p", "depends_on": ["a"]},
                {"id": "c", "prompt": "p", "depends_on": ["b"]},
                {"id": "d", "prompt": "p"},
                {"id": "e", "prompt": "p", "depends_on": ["d"]},
                {"id": "f", "prompt": "p", "depends_on": ["c", "e"]},
            ]
        }
    )


class Recorder:
    """An execute function that records when each task ran, in which thread; thread-safe."""

    def __init__(self, seconds: float = 0.0, fail: tuple[str, ...] = (), barrier: int | None = None) -> None:
        self.seconds = seconds
        self.fail = fail
        self.lock = threading.Lock()
        self.times: dict[str, tuple[float, float]] = {}
        self.threads: dict[str, str] = {}
        self.stdout: dict[str, object] = {}
        self.barrier = threading.Barrier(barrier) if barrier else None

    def __call__(self, task: PlanTask) -> bool:
        start = time.monotonic()
        if self.barrier is not None and task.id in ("a", "b", "c", "d"):
            self.barrier.wait(timeout=10)  # only passes if the wave's tasks really run at once
        time.sleep(self.seconds)
        with self.lock:
            self.times[task.id] = (start, time.monotonic())
            self.threads[task.id] = threading.current_thread().name
            self.stdout[task.id] = sys.stdout
        if task.id in self.fail:
            raise RuntimeError(f"{task.id} broke")
        return True


def test_compile_tasks_gives_doit_dicts() -> None:
    calls: list[PlanTask] = []

    def action(task: PlanTask) -> bool:
        calls.append(task)
        return True

    plan = buildout()
    tasks = compile_tasks(plan, action)
    assert [task["name"] for task in tasks] == ["schema", "reader", "writer", "docs"]
    docs = tasks[3]
    assert docs["doc"] == "Rewrite the receipts page"
    assert docs["task_dep"] == ["reader", "writer"]
    assert docs["uptodate"] == [False]
    assert docs["meta"] == {"prompt": plan.task("docs").prompt, "claims": [], "isolation": "isolated"}
    assert tasks[0]["meta"]["claims"] == ["src/store/schema.rs", "src/store/migrations.rs"]
    function, arguments = docs["actions"][0]
    function(*arguments)
    assert calls == [plan.task("docs")]
    assert compile_tasks(plan)[0]["actions"] == []


def test_doit_list_and_info_views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = doit_view(buildout(), ["list"])
    assert (code, err) == (0, "")
    assert [line.split()[0] for line in out.splitlines()] == ["schema", "reader", "writer", "docs"]
    assert "Add the migration" in out
    code, out, err = doit_view(buildout(), ["info", "docs"])
    assert code == 0, err
    assert "Rewrite the receipts page" in out and " - reader\n - writer" in out
    assert "'isolation': 'isolated'" in out
    code, out, err = doit_view(buildout(), ["info", "doc"])
    assert code == 3 and 'no task "doc"' in err and 'did you mean "docs"' in err
    code, out, err = doit_view(buildout(), ["run"])
    assert code == 3 and "stella fleet --plan" in err
    assert list(tmp_path.iterdir()) == [], "doit wrote a file"


def test_waves_of_two_on_real_threads_never_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    record = Recorder(seconds=0.15, barrier=2)
    runner = PlanRunner(independent("a", "b", "c", "d", "e"), 2, record)
    seen = runner.run()
    assert runner.waves == [["a", "b"], ["c", "d"], ["e"]]
    assert seen.statuses == dict.fromkeys("abcde", "succeeded")
    assert seen.reasons == {} and runner.stopped is None
    for earlier, later in zip(runner.waves, runner.waves[1:], strict=False):
        last_end = max(record.times[task_id][1] for task_id in earlier)
        first_start = min(record.times[task_id][0] for task_id in later)
        assert first_start >= last_end, f"wave {later} started before wave {earlier} ended"
    assert record.threads["a"] != record.threads["b"]
    assert all(stream is sys.stdout for stream in record.stdout.values()), "sys.stdout was swapped"
    assert list(tmp_path.iterdir()) == [], "doit wrote a file"


def test_failure_skips_exactly_the_transitive_dependents() -> None:
    events: list[Event] = []
    runner = PlanRunner(chain_plan(), 4, Recorder(fail=("a",)), on_event=events.append)
    seen = runner.run()
    assert seen.statuses == {
        "a": "failed",
        "b": "skipped",
        "c": "skipped",
        "d": "succeeded",
        "e": "succeeded",
        "f": "skipped",
    }
    assert seen.reasons == {
        "a": "RuntimeError: a broke",
        "b": "dependency failed: a",
        "c": "dependency failed: a",
        "f": "dependency failed: a",
    }
    assert runner.waves == [["a", "d"], ["e"]]
    skipped = [event for event in events if isinstance(event, TaskSkipped)]
    assert skipped == [
        TaskSkipped("b", "dependency failed: a"),
        TaskSkipped("c", "dependency failed: a"),
        TaskSkipped("f", "dependency failed: a"),
    ]


def test_a_diamond_names_the_failed_dependency() -> None:
    def execute(task: PlanTask) -> bool:
        return task.id != "writer"

    seen = PlanRunner(buildout(), 3, execute).run()
    assert seen.statuses == {
        "schema": "succeeded",
        "reader": "succeeded",
        "writer": "failed",
        "docs": "skipped",
    }
    assert seen.reasons == {"writer": "the task reported failure", "docs": "dependency failed: writer"}


def test_events_in_order() -> None:
    events: list[Event] = []
    PlanRunner(buildout(), 1, lambda task: True, on_event=events.append).run()
    kinds = [type(event) for event in events]
    assert kinds == [WaveStarted, TaskStarted, TaskEnded, WaveEnded] * 4
    assert events[0] == WaveStarted(1, ("schema",))
    assert events[1] == TaskStarted("schema", 1)
    assert events[2] == TaskEnded("schema", "succeeded", None)
    assert events[-1] == WaveEnded(4)


def test_before_start_can_stop_the_run() -> None:
    asked: list[tuple[int, list[str]]] = []
    limit = Stop(StopReason.SPEND_LIMIT, "spend limit reached")

    def before_start(number: int, ids: list[str]) -> Stop | None:
        asked.append((number, ids))
        return limit if number == 2 else None

    runner = PlanRunner(buildout(), 3, lambda task: True, before_start=before_start)
    seen = runner.run()
    assert asked == [(1, ["schema"]), (2, ["reader", "writer"])]
    assert runner.waves == [["schema"]]
    assert runner.stopped == limit
    assert seen.statuses == {
        "schema": "succeeded",
        "reader": "skipped",
        "writer": "skipped",
        "docs": "skipped",
    }
    assert seen.reasons == dict.fromkeys(["reader", "writer", "docs"], "spend limit reached")


def test_request_stop_from_a_worker_thread_lets_the_wave_finish() -> None:
    runner: PlanRunner

    def execute(task: PlanTask) -> bool:
        if task.id == "a":
            runner.request_stop(Stop(StopReason.INTERRUPTED))
            runner.request_stop(Stop(StopReason.SPEND_LIMIT, "second reason is ignored"))
        time.sleep(0.05)
        return True

    runner = PlanRunner(independent("a", "b", "c"), 2, execute)
    seen = runner.run()
    assert runner.waves == [["a", "b"]]
    assert seen.statuses == {"a": "succeeded", "b": "succeeded", "c": "skipped"}
    assert seen.reasons == {"c": "interrupted"} and runner.stopped == Stop(StopReason.INTERRUPTED)


def test_request_stop_before_run_launches_nothing() -> None:
    runner = PlanRunner(buildout(), 2, lambda task: pytest.fail("nothing may run"))
    runner.request_stop(Stop(StopReason.INTERRUPTED, "stopped early"))
    seen = runner.run()
    assert runner.waves == []
    assert set(seen.statuses.values()) == {"skipped"} and len(seen.statuses) == 4


def timed_run(plan: Plan, schedule: str) -> tuple[PlanRunner, dict[str, tuple[float, float]], list[Event]]:
    """Run plan at concurrency 2, the task `slow` taking 0.4 s and every other 0.02 s; each task's times."""
    times: dict[str, tuple[float, float]] = {}
    events: list[Event] = []

    def execute(task: PlanTask) -> bool:
        start = time.monotonic()
        time.sleep(0.4 if task.id == "slow" else 0.02)
        times[task.id] = (start, time.monotonic())
        return True

    runner = PlanRunner(plan, 2, execute, schedule=schedule, on_event=events.append)
    assert runner.run().statuses == dict.fromkeys(plan.ids, "succeeded")
    return runner, times, events


def test_the_schedules_differ_only_in_which_ready_tasks_start() -> None:
    plan = plan_from_data(
        {
            "tasks": [
                {"id": "slow", "prompt": "p"},
                {"id": "b", "prompt": "p"},
                {"id": "b2", "prompt": "p", "depends_on": ["b"]},
            ]
        }
    )
    runner, times, events = timed_run(plan, "waves")  # b2 waits for the whole first wave
    assert runner.waves == [["slow", "b"], ["b2"]]
    assert times["b2"][0] >= times["slow"][1]
    assert [event for event in events if isinstance(event, WaveStarted)][1] == WaveStarted(2, ("b2",))

    runner, times, events = timed_run(plan, "eager")  # the longer chain first, b2 as soon as b is done
    assert runner.waves == [["b"], ["slow"], ["b2"]]
    assert times["b2"][0] < times["slow"][1]
    assert not [event for event in events if isinstance(event, WaveStarted | WaveEnded)]
    assert TaskStarted("b2", 3) in events


def test_tasks_done_before_count_as_succeeded_and_do_not_run() -> None:
    ran: list[str] = []
    events: list[Event] = []

    def execute(task: PlanTask) -> bool:
        ran.append(task.id)
        return True

    runner = PlanRunner(buildout(), 2, execute, done=frozenset({"schema"}), on_event=events.append)
    assert runner.run().statuses == dict.fromkeys(["schema", "reader", "writer", "docs"], "succeeded")
    assert sorted(ran) == ["docs", "reader", "writer"]
    assert runner.waves == [["reader", "writer"], ["docs"]]
    assert not [event for event in events if getattr(event, "task", None) == "schema"]


def test_an_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule 'fast'"):
        PlanRunner(buildout(), 2, lambda task: True, schedule="fast")


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PlanRunner(buildout(), 0, lambda task: True)


@settings(max_examples=40, deadline=None)
@given(
    edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=20),
    width=st.integers(1, 4),
    failing=st.sets(st.integers(0, 11), max_size=2),
)
def test_runner_matches_plan_waves_and_skips_dependents(
    edges: list[tuple[int, int]], width: int, failing: set[int]
) -> None:
    deps: dict[int, set[int]] = {n: set() for n in range(12)}
    for a, b in edges:
        if a > b:
            deps[a].add(b)  # edges point backwards: a DAG
    plan = plan_from_data(
        {
            "tasks": [
                {"id": f"n{n}", "prompt": "p", "depends_on": [f"n{d}" for d in sorted(deps[n])]}
                for n in range(12)
            ]
        }
    )
    failed_ids = {f"n{n}" for n in failing}
    runner = PlanRunner(plan, width, lambda task: task.id not in failed_ids)
    seen = runner.run()
    if not failed_ids:
        assert runner.waves == plan.waves(width)
    doomed: set[str] = set()
    for n in range(12):  # dependents of a failure (in plan order, so dependencies come first)
        if any(f"n{d}" in failed_ids or f"n{d}" in doomed for d in deps[n]):
            doomed.add(f"n{n}")
    for task_id in plan.ids:
        if task_id in doomed:
            assert seen.statuses[task_id] == "skipped", task_id
            assert seen.reasons[task_id].startswith("dependency failed: ")
        elif task_id in failed_ids:
            assert seen.statuses[task_id] == "failed"
        else:
            assert seen.statuses[task_id] == "succeeded"
    assert all(len(wave) <= width for wave in runner.waves)
