"""A Plan as a doit task graph: compile it, show it (`doit list`/`info`), run it many tasks at once.
Relies on doit internals, pinned and checked by tests/run/test_doit_internals.py (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

from doit.cmd_base import TaskLoader2
from doit.control import TaskControl
from doit.dependency import Dependency, JsonDB
from doit.doit_cmd import DoitMain
from doit.exceptions import BaseFail, InvalidCommand, InvalidDodoFile, TaskError, TaskFailed, UnmetDependency
from doit.reporter import ZeroReporter
from doit.runner import Runner
from doit.task import DelayedLoader, Stream, Task, dict_to_task

from stellafleet.core.errors import PlanError
from stellafleet.core.status import Stop, StopReason, TaskStatus
from stellafleet.plan.model import Plan, PlanTask, load_plan
from stellafleet.plan.schema import suggest
from stellafleet.run.eager import SCHEDULES, start_order
from stellafleet.run.events import (
    Emit,
    SkipTask,
    TaskEnded,
    TaskParked,
    TasksEmitted,
    TaskSkipped,
    TaskStarted,
    WaveEnded,
    WaveStarted,
)
from stellafleet.run.expand import Expansions
from stellafleet.run.limiter import Limiter

Action = Callable[[PlanTask], bool]

BARRIER = ":emitted"
EXPANDS_NOTE = "(expands at run time)"
# doit commands about doit's dependency state, which a plan never has (it lives in memory)
STATE_COMMANDS = frozenset({"forget", "ignore", "reset-dep"})


def compile_tasks(
    plan: Plan, action: Callable[[PlanTask], Any] | None = None, done: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """doit task dicts for the plan, in plan order; the tasks in `done` (an earlier run's) are up to date."""
    return [doit_task(task, action, done) for task in plan.tasks]


def doit_task(
    task: PlanTask, action: Callable[[PlanTask], Any] | None, done: frozenset[str], deps: Sequence[str] = ()
) -> dict[str, Any]:
    """One task's doit dict; `deps` (default: its depends_on) are the doit names it waits for."""
    meta: dict[str, Any] = {"prompt": task.prompt, "claims": list(task.claims), "isolation": task.isolation}
    optional = {key: getattr(task, key) for key in ("pipeline", "model", "timeout", "parent")}
    meta.update((key, value) for key, value in optional.items() if value is not None)
    if task.expands:
        meta["expands"] = True
    return {
        "name": task.id,
        "doc": f"{task.title} {EXPANDS_NOTE}" if task.expands else task.title,
        "task_dep": list(deps or task.depends_on),
        "meta": meta,
        "uptodate": [task.id in done],
        "actions": [(action, [task])] if action is not None else [],
        "verbosity": 0,
        # doit's output capture swaps the process-wide sys.stdout: unsafe with threads
        "io": {"capture": False},
    }


def barrier(task_id: str) -> str:
    """The doit name of an expanding task's barrier, which waits for all it emitted (no plan id has ':')."""
    return task_id + BARRIER


class MemoryBackend(JsonDB):
    """doit's JSON dependency backend without the file: nothing is read or written."""

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        self._db: dict[str, Any] = {}

    def dump(self) -> None:
        """Nothing to save."""


# doit list / doit info (`stella plan list` / `stella plan info` run them in this process)


PLAN_OPTION = {
    "section": "stella",
    "name": "plan",
    "short": "",
    "long": "plan",
    "type": str,
    "default": None,
    "help": "the stella plan file whose task graph doit shows (config: plan under [tool.doit])",
}


class PlanLoader(TaskLoader2):
    """doit LOADER plugin "stella": a plan's tasks for `doit list` and `doit info` (docs/plans.md)."""

    cmd_options = (PLAN_OPTION,)

    def __init__(self, plan: Plan | None = None) -> None:
        super().__init__()
        self._plan = plan
        self._plan_path: str | None = None

    def setup(self, opt_values: dict[str, Any]) -> None:
        self._plan_path = opt_values.get("plan")

    def load_doit_config(self) -> dict[str, Any]:
        return {
            "backend": "sqlite3",
            "dep_file": ":memory:",  # keeps .doit.db out of the repository
            "hide_status": True,  # "would run: uptodate is False" says nothing about a plan
            "sort": "definition",  # list tasks in plan order
        }

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
        plan = self._plan if self._plan is not None else self._load()
        if getattr(cmd, "execute_tasks", False):
            where = plan.source or "PLAN"
            raise InvalidDodoFile(
                f"doit does not run stella plans: run it with `stella fleet --plan {where}` "
                "(`doit list` and `doit info TASK` show its graph)"
            )
        if cmd.get_name() in STATE_COMMANDS:
            raise InvalidDodoFile(
                f"`doit {cmd.get_name()}` has nothing to do for a stella plan: doit keeps no state for it "
                "(`doit list` and `doit info TASK` show its graph)"
            )
        if cmd.get_name() == "info" and len(pos_args) == 1 and pos_args[0] not in plan.ids:
            wanted = pos_args[0]
            raise InvalidCommand(f'no task "{wanted}" in {plan.source}{suggest(wanted, list(plan.ids))}')
        return [dict_to_task(task) for task in compile_tasks(plan)]

    def _load(self) -> Plan:
        if not self._plan_path:
            raise InvalidDodoFile(
                'no plan: set plan = "plan.toml" under [tool.doit] in pyproject.toml (or [GLOBAL] in '
                "doit.cfg), or pass --plan FILE"
            )
        try:
            return load_plan(self._plan_path)
        except PlanError as exc:
            raise InvalidDodoFile(str(exc)) from None


def doit_view(plan: Plan, argv: list[str]) -> tuple[int, str, str]:
    """Run a doit command (["list"]) on the compiled plan in this process; (exit code, stdout, stderr)."""
    main = DoitMain(task_loader=PlanLoader(plan), config_filenames=())
    main.BIN_NAME = "doit"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.run(list(argv))
    return int(code), out.getvalue(), err.getvalue()


# running


class Stopped(TaskError):
    """What doit is told of a task that never started because the run stopped first."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(str(stop))
        self.stop = stop


class ParkedFail(TaskFailed):
    """What doit is told of a task whose attempt parked: its dependents wait on it (skipped, saying so)."""


WAITS_ON_PARKED = "waits on parked"  # a dependent's skip reason when every failed root of it is parked


class DoitReporter(ZeroReporter):
    """Turns what doit tells of each task into the run's events (execute_task runs on a pool thread); a failed
    task's dependents are skipped naming it, an up-to-date task (--resume) succeeded."""

    def __init__(self, order: Mapping[str, int], emit: Emit | None) -> None:
        super().__init__(sys.stderr, {})
        self._order = order
        self.emit: Emit = emit or (lambda event: None)
        self.statuses: dict[str, TaskStatus] = {}  # id -> succeeded, failed or skipped
        self.reasons: dict[str, str] = {}  # id -> why it failed or was skipped
        self.steps: dict[str, int] = {}  # id -> the wave it starts in (eager: the how-manieth start)
        self._roots: dict[str, list[str]] = {}  # id -> the failed tasks it did not succeed for
        self._parked: set[str] = set()  # the tasks whose attempt parked

    def execute_task(self, task: Any) -> None:
        self.emit(TaskStarted(task.name, self.steps[task.name]))

    def add_success(self, task: Any) -> None:
        if task.name.endswith(BARRIER):  # not a task of the run: its emitter's and children's are told
            return
        self.statuses[task.name] = TaskStatus.SUCCEEDED
        self.emit(TaskEnded(task.name, TaskStatus.SUCCEEDED, None))

    def skip_uptodate(self, task: Any) -> None:
        self.statuses[task.name] = TaskStatus.SUCCEEDED

    def add_failure(self, task: Any, fail: BaseFail) -> None:
        if isinstance(fail, UnmetDependency):
            roots = {root for dep in task.task_dep for root in self._roots.get(dep, ())}
            self._roots[task.name] = sorted(roots, key=self._order.__getitem__)
            waits = roots and roots <= self._parked
            text = f"{WAITS_ON_PARKED}: " if waits else "dependency failed: "
            text += ", ".join(self._roots[task.name])
            fail = Stopped(Stop(StopReason.DEPENDENCY_FAILED, text))
        if isinstance(fail, ParkedFail):
            self._parked.add(task.name)
        if not isinstance(fail, Stopped):
            self._roots[task.name] = [task.name]
            self.statuses[task.name], self.reasons[task.name] = TaskStatus.FAILED, fail.message
            self.emit(TaskEnded(task.name, TaskStatus.FAILED, fail.message))
        elif not task.name.endswith(BARRIER):  # a barrier is no task of the run
            self.statuses[task.name], self.reasons[task.name] = TaskStatus.SKIPPED, str(fail.stop)
            self.emit(TaskSkipped(task.name, str(fail.stop)))

    def runtime_error(self, msg: str) -> None:
        raise RuntimeError(f"doit could not run the plan: {msg}")


class PlanRunner(Runner):
    """Runs a plan through doit's TaskDispatcher and Runner, at most `max_concurrency` tasks at once; the
    schedules differ only in _pick, and `before_start(n, ids)` may stop the run before the n-th start."""

    def __init__(
        self,
        plan: Plan,
        max_concurrency: int,
        execute: Action,
        *,
        schedule: str = "waves",
        durations: Mapping[str, float] | None = None,
        before_start: Callable[[int, list[str]], Stop | None] | None = None,
        on_event: Emit | None = None,
        done: frozenset[str] = frozenset(),
        gate: Limiter | None = None,
        expansions: Expansions | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self._order = {task_id: position for position, task_id in enumerate(plan.ids)}
        self.seen = DoitReporter(self._order, on_event)
        memory = Dependency(MemoryBackend, ":memory:")
        super().__init__(memory, self.seen, continue_=True, stream=Stream(0, force_global=True))
        self.plan = plan
        self.max_concurrency = max_concurrency
        self.eager = schedule == "eager"
        self._durations = durations or {}
        self._rank: Mapping[str, Any] = start_order(plan, self._durations) if self.eager else self._order
        self.expansions = expansions  # what expanding tasks emitted (None: tasks that expand add nothing)
        self._execute = execute
        self._before_start = before_start
        self.gate = gate  # the width and hold under provider limits (None: max_concurrency, no hold)
        self.done = done  # tasks an earlier run already did (--resume): up to date for doit
        self._lock = threading.RLock()  # re-entrant: a signal handler may interrupt a holder
        self.stopped: Stop | None = None  # why nothing more starts, once something stopped the run
        self.waves: list[list[str]] = []  # what started, in order: a wave each (eager: a task each)

    def request_stop(self, stop: Stop) -> None:
        """Start nothing more; running tasks finish. Safe from any thread or a signal handler."""
        with self._lock:
            if self.stopped is None:
                self.stopped = stop

    def run(self) -> DoitReporter:
        """Run the plan; what doit reported of each task."""
        tasks = self._doit_tasks(self.plan.tasks)
        for task in self.plan.tasks:  # what --resume found emitted before is known up front
            for child in self._known_children(task):
                self._order.setdefault(child.id, len(self._order))
        control = TaskControl(tasks)
        control.process(None)
        self.run_all(control.task_dispatcher())
        return self.seen

    def run_tasks(self, task_dispatcher: Any) -> None:
        self._dispatcher = task_dispatcher
        self._ready: dict[str, Any] = {}
        self._finished: list[Any] = []
        running: dict[Future[Any], Any] = {}
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="stella-run") as pool:
            self._hand_back()
            while self._ready or running:
                self._start_ready(pool, running)
                held = self._held(running)
                if running:
                    finished, _ = wait(running, timeout=held, return_when=FIRST_COMPLETED)
                    for future in sorted(finished, key=lambda f: self._order[running[f].task.name]):
                        node = running.pop(future)
                        try:
                            failure = future.result()
                        except BaseException as exc:  # e.g. SystemExit raised inside execute
                            failure = TaskError(f"{type(exc).__name__}: {exc}")
                        self.process_task_result(node, failure)
                        self._finished.append(node)
                    if not running and not self.eager:
                        self.seen.emit(WaveEnded(len(self.waves)))
                if self.eager or not running:  # a wave's dependents come up once the whole wave has ended
                    self._hand_back()

    def _held(self, running: dict[Future[Any], Any]) -> float | None:
        """How long to wait before looking again while the gate holds ready tasks; None: nothing held."""
        if self.gate is None or not self._ready or self.stopped is not None:
            return None
        hold = self.gate.hold_s()
        if hold <= 0:
            return None
        if not running:
            self.gate.wait(hold)
        return hold

    def _pick(self, running: int) -> list[str]:
        """The ready tasks to start now (none while the gate holds starts)."""
        if not self._ready or (running and not self.eager):
            return []
        if self.gate is not None and self.stopped is None:
            stop = self.gate.stop()
            if stop is not None:
                self.request_stop(stop)
            elif self.gate.hold_s() > 0:
                return []
        width = self.max_concurrency
        if self.gate is not None:
            width = max(1, min(width, self.gate.width()))
        if running >= width:
            return []
        ranked = sorted(self._ready, key=self._rank.__getitem__)
        return ranked[:1] if self.eager else ranked[:width]

    def _start_ready(self, pool: ThreadPoolExecutor, running: dict[Future[Any], Any]) -> None:
        """Start what _pick picks; once the run is stopped, skip every ready task instead."""
        while ids := self._pick(len(running)):
            if self.stopped is None and self._before_start is not None:  # it may veto the next start
                asked = self._before_start(len(self.waves) + 1, list(ids))
                if asked is not None:
                    self.request_stop(asked)
            stop = self.stopped
            if stop is not None:
                for task_id in sorted(self._ready, key=self._order.__getitem__):
                    node = self._ready.pop(task_id)
                    self._handle_task_error(node, Stopped(stop))
                    self._finished.append(node)  # handed back, so its dependents come up (and skip)
                return
            self.waves.append(ids)
            if not self.eager:
                self.seen.emit(WaveStarted(len(self.waves), tuple(ids)))
            for task_id in ids:
                self.seen.steps[task_id] = len(self.waves)
                node = self._ready.pop(task_id)
                running[pool.submit(self.execute_task, node.task)] = node

    def _hand_back(self) -> None:
        """Finished nodes handed back to doit's dispatcher, every task that became ready collected: its
        generator's send(node or None) gives the next node, "hold on", or StopIteration when all are."""
        pending = sorted(self._finished, key=lambda node: self._order[node.task.name], reverse=True)
        self._finished = []
        holding = False
        while pending or not holding:
            processed = pending.pop() if pending else None
            try:
                node = self._dispatcher.generator.send(processed)
            except StopIteration:
                return
            holding = node == "hold on"
            if holding:
                continue
            stop = self.stopped
            if stop is not None:
                self._handle_task_error(node, Stopped(stop))
                pending.append(node)
            elif self.select_task(node, self._dispatcher.tasks):
                if node.task.name.endswith(BARRIER):  # nothing to run: all it waited for has succeeded
                    self.process_task_result(node, None)
                    pending.append(node)
                    continue
                self._ready[node.task.name] = node
            else:
                pending.append(node)

    def _doit_tasks(self, tasks: Sequence[PlanTask]) -> list[Task]:
        """doit tasks for these plan tasks, each expanding one followed by its barrier (a DelayedLoader
        doit calls once the task was processed); a dependency on an expanding task waits for its barrier."""
        doit_tasks = []
        for task in tasks:
            deps = [self._doit_name(dep) for dep in task.depends_on]
            doit_tasks.append(dict_to_task(doit_task(task, self._run_task, self.done, deps)))
            if task.expands:
                loader = DelayedLoader(lambda task=task: self._grow(task), executed=task.id)
                doit_tasks.append(Task(barrier(task.id), None, loader=loader))
        return doit_tasks

    def _doit_name(self, task_id: str) -> str:
        known = self.expansions.tasks.get(task_id) if self.expansions is not None else None
        task = known or self.plan.task(task_id)
        return barrier(task_id) if task.expands else task_id

    def _known_children(self, task: PlanTask) -> tuple[PlanTask, ...]:
        return self.expansions.children(task.id) if self.expansions is not None and task.expands else ()

    def _grow(self, task: PlanTask) -> Iterator[Task]:
        """The barrier of an expanding task and what it emitted (nothing if it failed), joining the graph."""
        children = self._known_children(task)
        for child in children:
            self._order.setdefault(child.id, len(self._order))
        known = set(self.plan.ids)
        added = tuple(child for child in children if child.id not in known)
        if added:
            self.plan = replace(self.plan, tasks=self.plan.tasks + added)
            if self.eager:
                self._rank = start_order(self.plan, self._durations)
            self.seen.emit(TasksEmitted(task.id, tuple(child.id for child in added)))
        waits = [task.id, *(self._doit_name(child.id) for child in children)]
        return (item for item in [Task(barrier(task.id), None, task_dep=waits), *self._doit_tasks(children)])

    def _run_task(self, task: PlanTask) -> bool | BaseFail:
        try:
            succeeded = bool(self._execute(task))
        except SkipTask as exc:
            self.request_stop(exc.stop)
            return Stopped(exc.stop)
        except TaskParked as exc:
            return ParkedFail(str(exc))
        except Exception as exc:
            return TaskFailed(f"{type(exc).__name__}: {exc}")
        return True if succeeded else TaskFailed("the task reported failure")
