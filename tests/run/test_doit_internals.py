"""Tripwire: the doit internals stellafleet.run.waves relies on. If one of these fails, doit changed under us:
re-read doit's runner.py / control.py / cmd_base.py before widening the version pin in pyproject.toml."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import doit
from doit import cmd_base, control, dependency, doit_cmd, exceptions, reporter, runner, task
from doit.cmd_info import Info
from doit.cmd_list import List
from doit.cmd_run import Run

from stellafleet.plan.model import PlanTask, plan_from_data
from stellafleet.run.waves import MemoryBackend, PlanLoader, compile_tasks


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def needs(condition: bool, what: str) -> None:
    assert condition, f"doit internals changed: {what} (stellafleet.run.waves relies on it)"


def test_doit_version_is_the_pinned_minor() -> None:
    from importlib.metadata import version

    installed = tuple(int(part) for part in version("doit").split(".")[:2])
    needs(installed == (0, 37), f"doit {version('doit')} is not 0.37.x; pyproject pins >=0.37,<0.38")
    needs(tuple(doit.__version__[:2]) == (0, 37), "doit.__version__ agrees with the installed metadata")


def test_runner_methods_and_signatures() -> None:
    needs(
        parameters(runner.Runner.__init__)[:6]
        == ["self", "dep_manager", "reporter", "continue_", "always_execute", "stream"],
        "Runner.__init__(dep_manager, reporter, continue_, always_execute, stream)",
    )
    expected = {
        "run_all": ["self", "task_dispatcher"],
        "run_tasks": ["self", "task_dispatcher"],
        "select_task": ["self", "node", "tasks_dict"],
        "execute_task": ["self", "task"],
        "process_task_result": ["self", "node", "base_fail"],
        "_handle_task_error": ["self", "node", "base_fail"],
        "finish": ["self"],
    }
    for name, params in expected.items():
        needs(hasattr(runner.Runner, name), f"Runner.{name} exists")
        needs(parameters(getattr(runner.Runner, name)) == params, f"Runner.{name}{tuple(params[1:])}")
    source = inspect.getsource(runner.Runner.run_all)
    needs("self.run_tasks(task_dispatcher)" in source, "Runner.run_all calls self.run_tasks")
    needs("self.finish()" in source, "Runner.run_all calls self.finish")
    source = inspect.getsource(runner.Runner.process_task_result)
    needs("self._handle_task_error" in source, "process_task_result reports failures via _handle_task_error")
    needs('node.run_status = "successful"' in source, 'a successful node gets run_status "successful"')
    source = inspect.getsource(runner.Runner.select_task)
    needs("UnmetDependency(" in source, "select_task fails a node with bad_deps as UnmetDependency")
    needs("self.reporter.skip_uptodate(task)" in source, "select_task reports an up-to-date task")


class Recording:
    """doit's reporter protocol, every call recorded as (method, task name, failure class)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __getattr__(self, method: str) -> Any:
        def record(*args: Any) -> None:
            task_name = getattr(args[0], "name", "") if args else ""
            failure = type(args[1]).__name__ if len(args) > 1 else ""
            self.calls.append((method, task_name, failure))

        return record


def test_the_reporter_protocol_and_its_silent_base() -> None:
    methods = ["initialize", "get_status", "execute_task", "add_failure", "add_success", "skip_uptodate"]
    methods += ["skip_ignore", "cleanup_error", "runtime_error", "teardown_task", "complete_run"]
    for name in methods:
        needs(callable(getattr(reporter.ConsoleReporter, name, None)), f"the reporter protocol has {name}")
    needs(
        parameters(reporter.ZeroReporter.__init__)[:3] == ["self", "outstream", "options"],
        "ZeroReporter(outstream, options)",
    )
    silent = reporter.ZeroReporter(None, {})  # writes nothing for any task event
    for name in ("get_status", "execute_task", "add_success", "skip_uptodate", "teardown_task"):
        needs(getattr(silent, name)(None) is None, f"ZeroReporter.{name} does nothing")
    needs(silent.complete_run() is None, "ZeroReporter.complete_run does nothing")


def test_doit_runs_the_graph_and_reports_it() -> None:
    # what PlanRunner leaves to doit: the reporter calls, failure propagation and up-to-date tasks
    plan = plan_from_data(
        {
            "tasks": [
                {"id": "done", "prompt": "p"},
                {"id": "a", "prompt": "p", "depends_on": ["done"]},
                {"id": "b", "prompt": "p", "depends_on": ["a"]},
                {"id": "c", "prompt": "p", "depends_on": ["b"]},
                {"id": "d", "prompt": "p"},
            ]
        }
    )

    def action(item: PlanTask) -> bool | exceptions.BaseFail:
        return exceptions.TaskFailed("a broke") if item.id == "a" else True

    tasks = [task.dict_to_task(item) for item in compile_tasks(plan, action, frozenset({"done"}))]
    ctl = control.TaskControl(tasks)
    ctl.process(None)
    recording = Recording()
    doit_runner = runner.Runner(dependency.Dependency(MemoryBackend, ":memory:"), recording, continue_=True)
    doit_runner.run_all(ctl.task_dispatcher())
    reported = [call for call in recording.calls if call[0] != "get_status"]
    needs(reported[0][0] == "initialize" and reported[-1][0] == "complete_run", "initialize ... complete_run")
    needs(
        reported[1:-1]
        == [
            ("skip_uptodate", "done", ""),
            ("execute_task", "a", ""),
            ("add_failure", "a", "TaskFailed"),  # the failure the action returned, as it is
            ("add_failure", "b", "UnmetDependency"),
            ("add_failure", "c", "UnmetDependency"),  # transitively
            ("execute_task", "d", ""),
            ("add_success", "d", ""),
        ],
        "doit reports an up-to-date task, a failure and its dependents, and a success",
    )


def test_dispatcher_generator_protocol() -> None:
    needs(parameters(control.TaskControl.__init__)[:2] == ["self", "task_list"], "TaskControl(task_list)")
    needs(hasattr(control.TaskControl, "process"), "TaskControl.process(selection)")
    needs(hasattr(control.TaskControl, "task_dispatcher"), "TaskControl.task_dispatcher()")
    source = inspect.getsource(control.TaskDispatcher._dispatcher_generator)
    needs('yield "hold on"' in source, 'the dispatcher yields "hold on" while every task waits')
    needs("self._update_waiting(processed)" in source, "the value sent in is the processed node")
    needs(
        "if node.run_status == 'run':" in inspect.getsource(control.TaskDispatcher._update_waiting),
        "a node still marked 'run' is not treated as finished",
    )
    parent_status = inspect.getsource(control.ExecNode.parent_status)
    needs("'failure'" in parent_status and "bad_deps" in parent_status, "failed parents land in bad_deps")

    # and behaviourally: a two-task chain comes out one ready task at a time
    plan = plan_from_data(
        {"tasks": [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p", "depends_on": ["a"]}]}
    )
    tasks = [task.dict_to_task(item) for item in compile_tasks(plan)]
    ctl = control.TaskControl(tasks)
    ctl.process(None)
    dispatcher = ctl.task_dispatcher()
    first = dispatcher.generator.send(None)
    needs(first.task.name == "a" and hasattr(first, "bad_deps"), "the first ready node is task a")
    needs(dispatcher.generator.send(None) == "hold on", "b waits for a: the dispatcher says 'hold on'")
    first.run_status = "failure"
    second = dispatcher.generator.send(first)
    needs(second.task.name == "b" and second.bad_deps == [first], "b comes up with a in bad_deps")


def test_dependency_backend_interface() -> None:
    needs(
        parameters(dependency.Dependency.__init__)[:3] == ["self", "db_class", "backend_name"],
        "Dependency(db_class, backend_name)",
    )
    for name in ("dump", "set", "get", "in_", "remove", "remove_all"):
        needs(hasattr(dependency.JsonDB, name), f"JsonDB.{name}")
    manager = dependency.Dependency(MemoryBackend, ":memory:")
    manager.close()  # must not write anything
    needs(isinstance(manager.backend, MemoryBackend), "Dependency instantiates the backend class it gets")


def test_task_attributes_we_set() -> None:
    for name in ("name", "doc", "task_dep", "meta", "uptodate", "actions", "verbosity", "io"):
        needs(name == "name" or name in task.Task.valid_attr, f"task attribute {name!r}")
    needs(
        parameters(task.Stream.__init__)[:3] == ["self", "verbosity", "force_global"],
        "Stream(verbosity, force_global)",
    )
    needs(task.Stream._get_out_err(0) == (None, None), "verbosity 0 passes no streams to actions")
    # with io capture off and no streams, a python-action does not touch sys.stdout
    seen: list[object] = []

    def action() -> bool:
        seen.append(sys.stdout)
        return True

    item = {
        "name": "t",
        "actions": [(action, [])],
        "verbosity": 0,
        "io": {"capture": False},
    }
    before = sys.stdout
    needs(task.dict_to_task(item).execute(task.Stream(0, force_global=True)) is None, "the action succeeds")
    needs(seen == [before], "io capture off keeps sys.stdout as it is")


def test_loader_and_command_plumbing() -> None:
    needs(issubclass(PlanLoader, cmd_base.TaskLoader2), "TaskLoader2 is the loader base class")
    for name, params in {
        "setup": ["self", "opt_values"],
        "load_doit_config": ["self"],
        "load_tasks": ["self", "cmd", "pos_args"],
    }.items():
        needs(
            parameters(getattr(cmd_base.TaskLoader2, name)) == params,
            f"TaskLoader2.{name}{tuple(params[1:])}",
        )
    source = inspect.getsource(cmd_base.DoitCmdBase.execute)
    order = [
        source.index(part)
        for part in (
            "self.loader.setup(params)",
            "params.update_defaults(dodo_config)",
            "Dependency(",
            "self.loader.load_tasks(",
        )
    ]
    needs(order == sorted(order), "setup -> loader config as defaults -> dependency manager -> load_tasks")
    needs(
        Run.execute_tasks is True and List.execute_tasks is False and Info.execute_tasks is False,
        "Command.execute_tasks tells run apart from list/info",
    )
    needs(
        parameters(doit_cmd.DoitMain.__init__)[:4]
        == ["self", "task_loader", "config_filenames", "extra_config"],
        "DoitMain(task_loader, config_filenames, extra_config)",
    )
    needs("hide_status" in parameters(Info._execute), "doit info has hide_status")
    needs("sort" in parameters(List._execute), "doit list has sort")
    run_source = inspect.getsource(doit_cmd.DoitMain.run)
    needs(
        "InvalidDodoFile" in run_source and "return 3" in run_source,
        "DoitMain.run turns InvalidDodoFile into 'ERROR: ...' and exit 3",
    )


def test_delayed_task_creation_as_plans_that_grow_use_it() -> None:
    # an expanding task's barrier is a placeholder Task with a DelayedLoader(executed=...): doit adds the
    # `executed` task to its task_dep, calls the creator once that task is processed, takes the Tasks of the
    # generator it returns into its graph and re-processes the placeholder's node as the real task
    needs(
        parameters(task.DelayedLoader.__init__)[:3] == ["self", "creator", "executed"],
        "DelayedLoader(creator, executed)",
    )
    placeholder = task.Task("x:emitted", None, loader=task.DelayedLoader(lambda: None, executed="x"))
    needs(placeholder.task_dep == ["x"], "a loader's `executed` task becomes the placeholder's task_dep")
    source = inspect.getsource(control.TaskDispatcher)  # _add_task is wrapped by no_none
    needs("generate_tasks(to_load, task_gen" in source, "_add_task creates tasks with generate_tasks")
    needs("self.tasks[nt.name] = nt" in source, "_add_task adds the created tasks to the dispatcher's tasks")
    needs('yield "reset generator"' in source, "_add_task re-processes the placeholder as the created task")
    source = inspect.getsource(control.TaskDispatcher._dispatcher_generator)
    needs("node.reset_task(self.tasks[node.task.name]" in source, "the node is reset to the created task")
    from doit import loader

    made = loader.generate_tasks(
        "x:emitted", (t for t in [task.Task("x:emitted", None), task.Task("y", None)])
    )
    needs([t.name for t in made] == ["x:emitted", "y"], "generate_tasks takes Task objects from a generator")
