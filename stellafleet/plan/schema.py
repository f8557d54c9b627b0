"""The bundled plan JSON Schema, checked by jsonschema, and each of its problems in plain words; then the
checks a schema cannot express: ids, dependencies, cycles, and what fails only at run."""

from __future__ import annotations

import json
import re
from pathlib import Path as FilePath
from typing import Any

from stellafleet.core.schemaerrors import (
    TYPE_WORDS,
    BundledSchema,
    Path,
    SchemaProblem,
    article,
    describe,
    show,
    sort_key,
    suggest,
)
from stellafleet.git.worktrees import slugify

ID_PATTERN = "^[A-Za-z0-9._-]+$"


BUNDLED = BundledSchema(FilePath(__file__).parent / "plan.schema.json")


def schema_problems(data: Any, *, table_word: str = "table") -> list[tuple[Path, str]]:
    """Every schema violation as (location, message), in document order; [] when valid."""
    try:
        found = BUNDLED.problems(data)
    except RecursionError:
        return [((), "the plan is nested too deeply (a self-referencing YAML alias?)")]
    problems = [(problem.path, _explain(problem, table_word)) for problem in found]
    problems.sort(key=lambda item: sort_key(item[0]))
    return problems


def _explain(problem: SchemaProblem, table_word: str) -> str:
    path, keyword, expected, instance = problem.path, problem.keyword, problem.expected, problem.instance
    if keyword == "required":
        return MISSING.get(path[-1], "missing")  # only the plan requires "tasks", only a task the others
    if keyword == "additionalProperties":
        return f"unknown key{suggest(instance, problem.allowed, listing=True)}"
    if keyword == "type":
        return _wrong_type(path, expected, instance, table_word)
    if keyword == "enum":
        choices = " or ".join(json.dumps(choice) for choice in expected)
        return f"must be {choices}, not {show(instance)}{suggest(instance, expected)}"
    if keyword == "pattern":
        return _pattern(expected, instance)
    if keyword in ("minLength", "minItems"):
        return "the plan has no tasks" if path == ("tasks",) else "must not be empty"
    if keyword == "maxLength":
        return f"{show(instance)} is longer than {expected} characters"
    if keyword == "uniqueItems":
        return f"{show(_first_repeat(instance))} is listed more than once"
    if keyword == "exclusiveMinimum":
        return f"must be a number of seconds greater than {expected}, not {show(instance)}"
    if keyword == "minimum":
        return f"must be {expected} or more, not {show(instance)}"
    return problem.message  # a keyword added to the schema later: jsonschema's own words


MISSING = {
    "tasks": 'missing: a plan is a list of tasks ([[tasks]] in TOML, "tasks": [...] in JSON/YAML)',
    "prompt": "missing: every task needs a prompt",
    "id": "missing: every task needs an id (letters, digits, '.', '_', '-')",
}


def _wrong_type(path: Path, expected: str | list[str], instance: Any, table_word: str) -> str:
    kinds = [expected] if isinstance(expected, str) else list(expected)
    table = article(table_word)
    words = " or ".join(table if kind == "object" else TYPE_WORDS.get(kind, kind) for kind in kinds)
    if path == ():
        return f'a plan must be {table} with a "tasks" list, not {describe(instance, table_word)}'
    hint = ""
    if "array" in kinds and isinstance(instance, str):
        hint = f" (write [{json.dumps(instance)}])"
    return f"must be {words}, not {describe(instance, table_word)}{hint}"


def _pattern(pattern: str, instance: Any) -> str:
    if pattern == ID_PATTERN:
        return f"{show(instance)} is not a valid task id: use letters, digits, '.', '_' and '-'"
    if pattern == "\\S":
        return "must not be empty"
    return f"{show(instance)} does not match {pattern}"


def _first_repeat(values: list[Any]) -> Any:
    for index, value in enumerate(values):
        if any(type(value) is type(other) and value == other for other in values[:index]):
            return value
    return values[0] if values else None


TASK_ID = re.compile(ID_PATTERN)

# A lone UTF-16 surrogate (JSON and YAML can write "\ud800") is no text: nothing can be handed it.
_SURROGATE = re.compile("[\ud800-\udfff]")
TEXT_KEYS = ("prompt", "title", "pipeline", "model", "check")


def text_problem(value: str) -> str | None:
    """Why a plan string cannot be handed on (None: it can): a NUL, or a lone UTF-16 surrogate."""
    if "\x00" in value:
        return "contains a NUL character, which no worker can be handed"
    surrogate = _SURROGATE.search(value)
    if surrogate is not None:
        return (
            f"contains a lone surrogate (\\u{ord(surrogate.group()):04x}), which is not text: "
            "write the character itself"
        )
    return None


def task_run_problems(where: str, raw: dict[str, Any], isolation: Any) -> list[str]:
    """What passes the schema but would fail only when the task runs (a NUL, a bad branch name)."""
    problems = [
        f"{where}: {key}: {why}"
        for key in TEXT_KEYS
        if isinstance(raw.get(key), str) and (why := text_problem(raw[key])) is not None
    ]
    task_id = raw.get("id")
    if isolation == "isolated" and isinstance(task_id, str) and TASK_ID.match(task_id):
        shown = f"fleet/{slugify(task_id)}-<hash>"  # the run's hash: 16 hex digits
        # a slug has only letters, digits, '.', '_', '-', never one at its ends: '..' is all git can refuse
        if ".." in shown:
            problems.append(
                f"{where}: id: an isolated task works on the git branch {shown}, which git refuses: "
                "it contains '..'; give the task an id git accepts in a branch name"
            )
    return problems


def graph_problems(
    name: str,
    raw_tasks: list[Any],
    ids: list[str | None],
    labels: list[str],
    outside: frozenset[str] = frozenset(),
) -> list[str]:
    """Duplicate ids, self or unknown dependencies and cycles (a task of `outside` is known)."""
    problems: list[str] = []
    first_at: dict[str, int] = {}
    for position, task_id in enumerate(ids):
        if task_id is None:
            continue
        if task_id in first_at:
            problems.append(
                f"{name}: task #{position + 1}: id: duplicate id {json.dumps(task_id)} "
                f"(task #{first_at[task_id] + 1} has it too)"
            )
        else:
            first_at[task_id] = position
    known = list(first_at)
    edges: dict[str, list[str]] = {}
    for position, (raw, task_id) in enumerate(zip(raw_tasks, ids, strict=True)):
        dependencies = raw.get("depends_on") if isinstance(raw, dict) else None
        if not isinstance(dependencies, list) or not dependencies:
            continue
        # well-formed ids only (the schema reported the rest), each once
        dependencies = list(
            dict.fromkeys(dep for dep in dependencies if isinstance(dep, str) and TASK_ID.match(dep))
        )
        owns_edges = task_id is not None and first_at[task_id] == position
        for dependency in dependencies:
            if dependency == task_id:
                problems.append(f"{name}: {labels[position]}: depends_on: the task depends on itself")
            elif dependency not in first_at and dependency in outside:
                continue
            elif dependency not in first_at:
                hint = suggest(dependency, known + sorted(outside))
                problems.append(f'{name}: {labels[position]}: depends_on: unknown task "{dependency}"{hint}')
            elif owns_edges:
                edges.setdefault(task_id, []).append(dependency)  # type: ignore[arg-type]
    for cycle in _cycles(known, edges):
        problems.append(f"{name}: dependency cycle: {' -> '.join(cycle)}")
    return problems


def _cycles(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per strongly connected group, a -> b -> ... -> a from its first task in plan order."""
    order = {node: position for position, node in enumerate(nodes)}
    cycles = []
    for component in _strongly_connected(nodes, edges):
        if len(component) < 2:
            continue
        start = min(component, key=order.__getitem__)
        cycles.append(_cycle_through(start, edges))
    cycles.sort(key=lambda cycle: order[cycle[0]])
    return cycles


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Kosaraju's algorithm, iterative (plans can be deep enough to overflow Python's stack)."""
    finished: list[str] = []  # each node once all it depends on is finished
    seen: set[str] = set()
    for root in nodes:
        if root in seen:
            continue
        seen.add(root)
        work = [(root, iter(edges.get(root, ())))]
        while work:
            node, successors = work[-1]
            target = next((target for target in successors if target not in seen), None)
            if target is None:
                work.pop()
                finished.append(node)
            else:
                seen.add(target)
                work.append((target, iter(edges.get(target, ()))))
    dependents: dict[str, list[str]] = {}
    for node, targets in edges.items():
        for target in targets:
            dependents.setdefault(target, []).append(node)
    assigned: set[str] = set()
    components = []
    for root in reversed(finished):
        if root in assigned:
            continue
        assigned.add(root)
        component, todo = [], [root]
        while todo:
            node = todo.pop()
            component.append(node)
            fresh = [source for source in dependents.get(node, ()) if source not in assigned]
            assigned.update(fresh)
            todo.extend(fresh)
        components.append(component)
    return components


def _cycle_through(start: str, edges: dict[str, list[str]]) -> list[str]:
    """The shortest path start -> ... -> start (BFS); it never leaves start's strongly connected group."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in edges.get(node, ()):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    return [start, start]  # unreachable for a real strongly connected group
