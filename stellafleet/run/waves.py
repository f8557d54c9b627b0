"""A Plan as a doit task graph: compile it, show it with doit, and run it in waves.

doit is the graph engine: `compile_tasks` turns a Plan into doit task dicts, `PlanLoader` lets plain
`doit list` / `doit info` inspect that graph in a user's repository (and refuses `doit run`: plans run
through `stella fleet`), and `WaveRunner` drives doit's own TaskDispatcher one wave at a time. doit's
dependency file is never written: the graph always runs against an in-memory backend.

This relies on doit internals (TaskDispatcher's generator protocol, Runner.select_task /
execute_task / process_task_result, DoitCmdBase.execute); doit is pinned to one minor version and
tests/run/test_doit_internals.py fails loudly if they change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from doit.cmd_base import TaskLoader2
from doit.control import TaskControl
from doit.dependency import Dependency, JsonDB
from doit.exceptions import InvalidCommand, InvalidDodoFile
from doit.runner import Runner
from doit.task import Stream, dict_to_task

from stellafleet.core.errors import PlanError
from stellafleet.core.status import TaskStatus
from stellafleet.plan.model import Plan, PlanTask, load_plan
from stellafleet.plan.schema import suggest
from stellafleet.run.events import Emit, SkipTask, TaskEnded, TaskSkipped, TaskStarted, WaveEnded, WaveStarted

Action = Callable[[PlanTask], bool]
MEMORY_BACKEND = "stella-memory"
# doit commands about doit's dependency state, which a plan never has (it lives in memory)
STATE_COMMANDS = frozenset({"forget", "ignore", "reset-dep"})


def compile_tasks(plan: Plan, action: Action | None = None) -> list[dict[str, Any]]:
    """doit task dicts for the plan, in plan order; each task's action calls `action(plan_task)`."""
    tasks = []
    for task in plan.tasks:
        meta: dict[str, Any] = {
            "prompt": task.prompt,
            "claims": list(task.claims),
            "isolation": task.isolation,
        }
        for key in ("pipeline", "model", "timeout"):
            value = getattr(task, key)
            if value is not None:
                meta[key] = value
        tasks.append(
            {
                "name": task.id,
                "doc": task.title,
                "task_dep": list(task.depends_on),
                "meta": meta,
                "uptodate": [False],  # a plan task always runs when asked: nothing is cached
                "actions": [(action, [task])] if action is not None else [],
                "verbosity": 0,
                # doit's output capture swaps the process-wide sys.stdout: unsafe with threads
                "io": {"capture": False},
            }
        )
    return tasks


class MemoryBackend(JsonDB):
    """doit's JSON dependency backend without the file: nothing is read or written."""

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        self._db: dict[str, Any] = {}

    def dump(self) -> None:
        """Nothing to save."""


# ---------------------------------------------------------------------------------------------
# doit list / doit info


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
    """doit LOADER plugin "stella": the tasks of a stella plan, for `doit list` and `doit info`.

    Configure it in pyproject.toml: `[tool.doit]` with `loader = "stella"` and `plan = "plan.toml"`
    (or pass `--plan FILE`). Running the plan through doit is refused: `stella fleet` runs it."""

    cmd_options = (PLAN_OPTION,)

    def __init__(self, plan: Plan | None = None, *, backend: str = "sqlite3") -> None:
        super().__init__()
        self._plan = plan
        self._plan_path: str | None = None
        # doit's built-in sqlite3 backend on ":memory:" keeps .doit.db out of the repository; an
        # in-process caller that registered MemoryBackend can use that instead
        self._backend = backend

    def setup(self, opt_values: dict[str, Any]) -> None:
        self._plan_path = opt_values.get("plan")

    def load_doit_config(self) -> dict[str, Any]:
        return {
            "backend": self._backend,
            "dep_file": ":memory:",
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
                'no plan: set plan = "plan.toml" under [tool.doit] in pyproject.toml, or pass --plan FILE'
            )
        try:
            return load_plan(self._plan_path)
        except PlanError as exc:
            raise InvalidDodoFile(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# running in waves


@dataclass
class WaveOutcome:
    """What a WaveRunner run did."""

    statuses: dict[str, TaskStatus] = field(default_factory=dict)  # id -> succeeded, failed or skipped
    reasons: dict[str, str] = field(default_factory=dict)  # id -> why it failed or was skipped
    waves: list[list[str]] = field(default_factory=list)  # the waves actually launched, in order
    stopped: str | None = None  # why no further wave was launched, if something stopped the run


class _SilentReporter:
    """doit's reporter interface as a no-op sink: the WaveRunner reports through on_event."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class WaveRunner(Runner):
    """Runs a plan through doit's TaskDispatcher one wave at a time.

    Each wave is up to `max_concurrency` ready tasks in plan order, run at once in a thread pool
    (the threads only wait: `execute` is expected to start a worker process and wait for it); the
    next wave starts when the whole wave has finished. A failed task's dependents are skipped,
    transitively; independent tasks go on. Events are emitted from the thread that called run().
    """

    def __init__(
        self,
        plan: Plan,
        max_concurrency: int,
        execute: Action,
        *,
        before_wave: Callable[[int, list[str]], str | None] | None = None,
        on_event: Emit | None = None,
        done: frozenset[str] = frozenset(),
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        super().__init__(
            Dependency(MemoryBackend, ":memory:"),
            _SilentReporter(),
            continue_=True,
            always_execute=True,
            stream=Stream(0, force_global=True),
        )
        self.plan = plan
        self.max_concurrency = max_concurrency
        self._execute = execute
        self._before_wave = before_wave
        self._on_event = on_event
        self.done = done  # tasks an earlier run already did (--resume): they count as succeeded, unrun
        self._order = {task_id: position for position, task_id in enumerate(plan.ids)}
        self._lock = threading.RLock()  # re-entrant: a signal handler may interrupt a holder
        self._stop_reason: str | None = None
        self._errors: dict[str, str] = {}
        self._skipped: dict[str, str] = {}  # task id -> why its action skipped it (SkipTask)
        self._root_failures: dict[str, list[str]] = {}
        self.outcome = WaveOutcome()

    def request_stop(self, reason: str) -> None:
        """Launch no further wave; running tasks finish. Safe from any thread or a signal handler."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason

    def run(self) -> WaveOutcome:
        tasks = [dict_to_task(task) for task in compile_tasks(self.plan, self._run_task)]
        control = TaskControl(tasks)
        control.process(None)
        self.run_all(control.task_dispatcher())
        for task_id in self.plan.ids:  # defensive: every task ends with a status
            if task_id not in self.outcome.statuses:
                self._skip_id(task_id, "not dispatched")
        return self.outcome

    # doit's Runner calls this to run every task; here it runs them in waves
    def run_tasks(self, task_dispatcher: Any) -> None:
        self._dispatcher = task_dispatcher
        self._ready: dict[str, Any] = {}
        self._finished: list[Any] = []
        self._pull()
        wave_number = 0
        # One pool for every wave: a pool per wave started its threads anew each time, and the start of
        # each waited for the new thread to get going while the wave's first tasks were starting.
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="stella-wave") as pool:
            while self._ready:
                wave = sorted(self._ready, key=self._order.__getitem__)[: self.max_concurrency]
                reason = self._stop_before(wave_number + 1, wave)
                if reason is not None:
                    self._skip_ready(reason)
                else:
                    wave_number += 1
                    self._run_wave(pool, wave_number, [self._ready.pop(task_id) for task_id in wave])
                self._pull()
        self.outcome.stopped = self._current_stop()

    def _current_stop(self) -> str | None:
        with self._lock:
            return self._stop_reason

    def _stop_before(self, number: int, ids: list[str]) -> str | None:
        """Why the next start (wave or task `number`, of ids) must not happen: a stop already requested,
        or before_wave's veto (which then stops the run); None: it may start."""
        reason = self._current_stop()
        if reason is None and self._before_wave is not None:
            asked = self._before_wave(number, list(ids))
            if asked is not None:
                self.request_stop(asked)
                reason = self._current_stop()
        return reason

    def _skip_ready(self, reason: str) -> None:
        """Skip every ready task for reason, in plan order."""
        for task_id in sorted(self._ready, key=self._order.__getitem__):
            node = self._ready.pop(task_id)
            self._skip(node, reason)
            self._finished.append(node)  # handed back, so its dependents come up (and skip)

    def _pull(self) -> None:
        """Hand finished nodes back to the dispatcher and collect every task that became ready.

        Protocol of TaskDispatcher.generator: each send() passes a processed node (or None) and
        returns the next ExecNode ready to run, or "hold on" when everything left waits on a task
        still running; StopIteration when all tasks were dispatched."""
        pending = list(reversed(self._finished))
        self._finished = []
        holding = False
        while True:
            if pending:
                processed = pending.pop()
            elif holding:
                return
            else:
                processed = None
            try:
                node = self._dispatcher.generator.send(processed)
            except StopIteration:
                return
            if node == "hold on":
                holding = True
                continue
            holding = False
            reason = self._current_stop()
            if reason is not None:
                self._skip(node, reason)
                pending.append(node)
            elif node.bad_deps:
                roots = sorted(
                    {root for bad in node.bad_deps for root in self._root_failures[bad.task.name]},
                    key=self._order.__getitem__,
                )
                self._skip(node, "dependency failed: " + ", ".join(roots), roots=roots)
                pending.append(node)
            elif node.task.name in self.done:  # done by an earlier run: counts as succeeded, unrun
                node.run_status, self.outcome.statuses[node.task.name] = "successful", TaskStatus.SUCCEEDED
                pending.append(node)
            elif self.select_task(node, self._dispatcher.tasks):
                self._ready[node.task.name] = node
            else:  # doit refused it (cannot happen with uptodate=[False]; kept safe)
                self._fail(node, "doit did not select the task")
                pending.append(node)

    def _run_wave(self, pool: ThreadPoolExecutor, number: int, nodes: list[Any]) -> None:
        ids = [node.task.name for node in nodes]
        self.outcome.waves.append(ids)
        self._emit(WaveStarted(number, tuple(ids)))
        futures: dict[Future[Any], Any] = {}
        for node in nodes:
            self._emit(TaskStarted(node.task.name, number))
            futures[pool.submit(self.execute_task, node.task)] = node
        for future in as_completed(futures):
            self._conclude(futures[future], future)
        self._finished.extend(nodes)
        self._emit(WaveEnded(number))

    def _conclude(self, node: Any, future: Future[Any]) -> None:
        """Record the verdict on a task whose execution has finished (on the thread that called run())."""
        try:
            failure = future.result()
        except BaseException as exc:  # e.g. SystemExit raised inside execute
            self._errors[node.task.name] = f"{type(exc).__name__}: {exc}"
            self._fail(node, self._errors[node.task.name])
            return
        self.process_task_result(node, failure)
        if node.run_status == "successful":
            self.outcome.statuses[node.task.name] = TaskStatus.SUCCEEDED
            self._emit(TaskEnded(node.task.name, TaskStatus.SUCCEEDED, None))
        elif node.task.name in self._skipped:
            self._skip(node, self._skipped[node.task.name])
        else:
            reason = self._errors.get(node.task.name) or _failure_text(failure)
            self._record_failure(node, reason)

    def _run_task(self, task: PlanTask) -> bool:
        """The doit python-action of every task (runs in a pool thread)."""
        try:
            succeeded = bool(self._execute(task))
        except SkipTask as exc:
            self.request_stop(self._skipped.setdefault(task.id, str(exc)))
            return False
        except Exception as exc:
            self._errors[task.id] = f"{type(exc).__name__}: {exc}"
            return False
        if not succeeded:
            self._errors[task.id] = "the task reported failure"
        return succeeded

    def _handle_task_error(self, node: Any, base_fail: Any) -> None:
        node.run_status = "failure"
        self.dep_manager.remove_success(node.task)
        self.final_result = 1

    def _fail(self, node: Any, reason: str) -> None:
        node.run_status = "failure"
        self.final_result = 1
        self._record_failure(node, reason)

    def _record_failure(self, node: Any, reason: str) -> None:
        task_id = node.task.name
        self._root_failures[task_id] = [task_id]
        self.outcome.statuses[task_id] = TaskStatus.FAILED
        self.outcome.reasons[task_id] = reason
        self._emit(TaskEnded(task_id, TaskStatus.FAILED, reason))

    def _skip(self, node: Any, reason: str, *, roots: list[str] | None = None) -> None:
        node.run_status = "failure"  # so doit hands the bad news on to its dependents
        self._root_failures[node.task.name] = roots or []
        self._skip_id(node.task.name, reason)

    def _skip_id(self, task_id: str, reason: str) -> None:
        self.outcome.statuses[task_id] = TaskStatus.SKIPPED
        self.outcome.reasons[task_id] = reason
        self._emit(TaskSkipped(task_id, reason))

    def _emit(self, event: TaskEnded | TaskSkipped | TaskStarted | WaveEnded | WaveStarted) -> None:
        if self._on_event is not None:
            self._on_event(event)


def _failure_text(failure: Any) -> str:
    try:
        return "failed" if failure is None else str(failure.get_msg()).strip().splitlines()[-1]
    except Exception:
        return str(failure)
