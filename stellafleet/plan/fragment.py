"""Plan fragments: the tasks an expanding task (`expands = true`) adds to its run, as `<emitter>.<id>`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stellafleet.core.errors import PlanError
from stellafleet.plan.model import PlanTask, normalise_claim, plan_from_data, read_fragment_file

TASK_ID_MAX = 128  # plan.schema.json's taskId maxLength: ids become file names


@dataclass(frozen=True)
class FragmentRules:
    """What a fragment is checked against besides the plan checks."""

    visible: frozenset[str]  # the full ids its tasks may depend on
    depth: int  # how deep its tasks are: 1 for what a plan task emits
    max_depth: int
    emitted_before: int  # tasks the run's fragments added so far
    max_emitted: int
    plan_defaults: Mapping[str, Any] = field(default_factory=dict)  # the plan's [defaults], under its own


def fragment_name(emitter: str) -> str:
    return f"fragment of {json.dumps(emitter)}"


def load_fragment(path: Path, emitter: PlanTask, rules: FragmentRules) -> tuple[PlanTask, ...]:
    """The checked, renamed tasks of emitter's fragment at path; PlanError listing every problem."""
    name = fragment_name(emitter.id)
    read = read_fragment_file(path, name)
    if read is None or (isinstance(read.data, dict) and read.data.get("tasks") == []):
        return ()
    data = read.data
    if rules.plan_defaults and isinstance(data, dict):  # the plan's [defaults] first, then its own
        own: dict[str, Any] = data["defaults"] if isinstance(data.get("defaults"), dict) else {}
        data = {**data, "defaults": {**rules.plan_defaults, **own}}
    # checked on the tasks as written, so they are reported with the plan checks' problems too
    loose = _loose_tasks(data)
    extra = claim_overlaps(name, loose) + _limit_problems(name, loose, rules) + _long_ids(emitter.id, loose)
    try:
        plan = plan_from_data(data, source=name, table_word=read.table_word, outside=rules.visible)
    except PlanError as exc:
        raise PlanError(exc.problems + extra) from None
    if extra:
        raise PlanError(extra)
    return rename(emitter.id, plan.tasks)


def _loose_tasks(data: Any) -> list[PlanTask]:
    """The fragment's tasks as far as they can be read whatever else is wrong with them."""
    raw_tasks = data.get("tasks") if isinstance(data, dict) else None
    defaults = data.get("defaults") if isinstance(data, dict) else None
    isolation = defaults.get("isolation", "shared") if isinstance(defaults, dict) else "shared"
    tasks = []
    for raw in raw_tasks if isinstance(raw_tasks, list) else []:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            continue
        claims = []
        listed: list[Any] = raw["claims"] if isinstance(raw.get("claims"), list) else []
        for claim in listed:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                claims.append(normalise_claim(claim))
        deps: list[Any] = raw["depends_on"] if isinstance(raw.get("depends_on"), list) else []
        tasks.append(
            PlanTask(
                id=raw["id"],
                prompt="",
                title="",
                depends_on=tuple(dep for dep in deps if isinstance(dep, str)),
                claims=tuple(dict.fromkeys(claims)),
                isolation=str(raw.get("isolation", isolation)),
                expands=raw.get("expands") is True,
            )
        )
    return tasks


def rename(emitter: str, tasks: Sequence[PlanTask]) -> tuple[PlanTask, ...]:
    """The fragment's tasks as the run knows them: `<emitter>.<id>`, their parent the emitter."""
    local = {task.id for task in tasks}

    def full(task_id: str) -> str:
        return f"{emitter}.{task_id}" if task_id in local else task_id

    return tuple(
        replace(task, id=full(task.id), depends_on=tuple(map(full, task.depends_on)), parent=emitter)
        for task in tasks
    )


def claim_overlaps(name: str, tasks: Sequence[PlanTask]) -> list[str]:
    """Two shared tasks that claim one file while neither waits for the other (one would fail)."""
    by_id = {task.id: task for task in tasks}
    before = {task.id: visible_to(task, by_id) for task in tasks}  # no task of a fragment has a parent yet
    claimed: dict[str, list[str]] = {}
    problems = []
    for task in tasks:
        if task.isolation == "isolated":
            continue
        for claim in task.claims:
            for other in claimed.setdefault(claim, []):
                if other not in before[task.id] and task.id not in before[other]:
                    problems.append(
                        f'{name}: task "{task.id}": claims: "{claim}" is claimed by task "{other}" too, '
                        "and they may run at the same time; make one depend on the other"
                    )
            claimed[claim].append(task.id)
    return problems


def _limit_problems(name: str, tasks: Sequence[PlanTask], rules: FragmentRules) -> list[str]:
    problems = []
    room = max(rules.max_emitted - rules.emitted_before, 0)
    if len(tasks) > room:
        problems.append(
            f"{name}: emits {len(tasks)} tasks, more than the {room} the run may still add "
            f"([fleet] max_emitted_tasks = {rules.max_emitted}, {rules.emitted_before} emitted so far); "
            "emit fewer tasks or raise the limit"
        )
    problems.extend(
        f'{name}: task "{task.id}": expands: an emitted task {rules.depth} levels down may not '
        f"expand ([fleet] max_expand_depth = {rules.max_depth}); do its work in it, or raise the limit"
        for task in tasks
        if task.expands and rules.depth >= rules.max_depth
    )
    return problems


def _long_ids(emitter: str, tasks: Sequence[PlanTask]) -> list[str]:
    """Tasks whose full id `<emitter>.<id>` is longer than a plan's task id may be (its file names too)."""
    name = fragment_name(emitter)
    return [
        f'{name}: task "{task.id}": its full id "{emitter}.{task.id}" is {len(emitter) + 1 + len(task.id)} '
        f"characters, more than the {TASK_ID_MAX} a task id may have; give it a shorter id"
        for task in tasks
        if len(emitter) + 1 + len(task.id) > TASK_ID_MAX
    ]


def visible_to(task: PlanTask, tasks: Mapping[str, PlanTask]) -> frozenset[str]:
    """The tasks a task's fragment may depend on: its dependencies, transitively, and what they emitted."""
    emitted: dict[str, list[str]] = {}
    for other in tasks.values():
        if other.parent is not None:
            emitted.setdefault(other.parent, []).append(other.id)
    seen: set[str] = set()
    todo = list(task.depends_on)
    while todo:
        task_id = todo.pop()
        if task_id not in seen and task_id in tasks:
            seen.add(task_id)
            todo.extend(tasks[task_id].depends_on)
            todo.extend(emitted.get(task_id, ()))
    return frozenset(seen)
