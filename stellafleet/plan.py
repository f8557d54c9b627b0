"""Plans: load a plan file (or inline prompts), check it whole, and hand back an immutable Plan.

A plan is checked in three passes and every problem of every pass is reported at once: the file is
parsed (a syntax error carries its line and column), the data is checked against the bundled JSON
Schema, then the things a schema cannot say are checked: claims stay inside the workspace, ids are
unique, every dependency names another task, and the dependencies form no cycle.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import posixpath
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from stellafleet import planschema
from stellafleet.errors import PlanError, StellaError

ISOLATIONS = ("shared", "isolated")
PLAN_SUFFIXES = (".toml", ".json", ".yaml", ".yml")
TITLE_WIDTH = 72
_ID = re.compile(planschema.ID_PATTERN)
_PLAIN_KEY = re.compile(r"[$A-Za-z0-9_.-]+")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")
# already normal: segments joined by single slashes, none "." or "..", no leading or trailing slash
_PLAIN_CLAIM = re.compile(r"(?!\.\.?(?:/|$))(?!.*/\.\.?(?:/|$))[^/\\~\x00][^/\x00]*(?:/[^/\x00]+)*")


@dataclass(frozen=True)
class PlanTask:
    """One task of a plan, with defaults applied and claims normalised."""

    id: str
    prompt: str
    title: str
    depends_on: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    isolation: str = "shared"
    pipeline: str | None = None
    model: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Plan:
    """A checked plan: tasks in plan order; `source` and `sha256` say which file it came from."""

    tasks: tuple[PlanTask, ...]
    source: str | None = None
    sha256: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @cached_property
    def _by_id(self) -> dict[str, PlanTask]:
        return {task.id: task for task in self.tasks}

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(task.id for task in self.tasks)

    def task(self, task_id: str) -> PlanTask:
        """The task with this id; a StellaError naming the closest id when there is none."""
        try:
            return self._by_id[task_id]
        except KeyError:
            hint = planschema.suggest(task_id, list(self._by_id))
            raise StellaError(f"no task {json.dumps(task_id)} in {self.source or 'the plan'}{hint}") from None

    def waves(self, max_concurrency: int) -> list[list[str]]:
        """Greedy waves: each holds up to max_concurrency tasks whose dependencies ran in earlier
        waves, taken in plan order; a wave starts only after the previous one has finished."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        index = {task.id: position for position, task in enumerate(self.tasks)}
        waiting_on = [len(task.depends_on) for task in self.tasks]
        dependents: list[list[int]] = [[] for _ in self.tasks]
        for position, task in enumerate(self.tasks):
            for dependency in task.depends_on:
                dependents[index[dependency]].append(position)
        ready = [position for position, count in enumerate(waiting_on) if count == 0]
        heapq.heapify(ready)
        waves: list[list[str]] = []
        while ready:
            wave = [heapq.heappop(ready) for _ in range(min(max_concurrency, len(ready)))]
            waves.append([self.tasks[position].id for position in wave])
            for position in wave:
                for dependent in dependents[position]:
                    waiting_on[dependent] -= 1
                    if waiting_on[dependent] == 0:
                        heapq.heappush(ready, dependent)
        return waves

    def wave_numbers(self, max_concurrency: int) -> dict[str, int]:
        """task id -> its wave (1-based) under waves(max_concurrency)."""
        return {
            task_id: number
            for number, wave in enumerate(self.waves(max_concurrency), start=1)
            for task_id in wave
        }


# ---------------------------------------------------------------------------------------------
# entry points


def load_plan(path: str | Path, *, root: Path | None = None) -> Plan:
    """Load and check a plan file; PlanError lists every problem found.

    `root` is the workspace the claims are relative to (default: the git repository holding the
    plan file, else its directory); it is only used to warn about claims naming directories."""
    name = str(path)
    plan_path = Path(path)
    suffix = plan_path.suffix.lower()
    if suffix not in PLAN_SUFFIXES:
        shown = f'"{plan_path.suffix}"' if plan_path.suffix else "(none)"
        raise PlanError([f"{name}: unknown plan format {shown}: use .toml, .json, .yaml or .yml"])
    try:
        raw = plan_path.read_bytes()
    except FileNotFoundError:
        raise PlanError([f"{name}: no such file"]) from None
    except IsADirectoryError:
        raise PlanError([f"{name}: is a directory, not a plan file"]) from None
    except OSError as exc:
        raise PlanError([f"{name}: cannot read: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PlanError([f"{name}:{line}: not UTF-8 text (byte {exc.start})"]) from None
    data = _PARSERS[suffix](text, name)
    workspace = root if root is not None else _workspace_of(plan_path)
    return plan_from_data(
        data,
        source=name,
        sha256=hashlib.sha256(raw).hexdigest(),
        root=workspace,
        table_word=_TABLE_WORDS[suffix],
    )


def plan_from_prompts(prompts: Sequence[str]) -> Plan:
    """Inline prompts as a plan of independent tasks t1, t2, ... titled by their first line."""
    problems = [
        f"prompt #{number}: must not be empty"
        for number, prompt in enumerate(prompts, start=1)
        if not isinstance(prompt, str) or not prompt.strip()
    ]
    if not prompts:
        problems.append("no tasks: give one or more prompts, or --plan FILE")
    if problems:
        raise PlanError(problems)
    return Plan(
        tasks=tuple(
            PlanTask(id=f"t{number}", prompt=prompt, title=title_from(prompt))
            for number, prompt in enumerate(prompts, start=1)
        )
    )


def plan_from_data(
    data: Any,
    *,
    source: str | None = None,
    sha256: str | None = None,
    root: Path | None = None,
    table_word: str = "table",
) -> Plan:
    """Check already-parsed plan data (what a TOML/JSON/YAML file holds) and build the Plan."""
    name = source or "plan"
    raw_tasks: list[Any] = data.get("tasks") if isinstance(data, dict) else None  # type: ignore[assignment]
    ids = [_usable_id(raw) for raw in raw_tasks] if isinstance(raw_tasks, list) else []
    labels = _labels(ids)
    schema_problems = planschema.schema_problems(data, table_word=table_word)
    problems = [_at(name, labels, location, message) for location, message in schema_problems]
    if not isinstance(raw_tasks, list):
        raise PlanError(problems or [f"{name}: the plan has no tasks"])
    defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    warnings: list[str] = []
    problems.extend(f"{name}: defaults: timeout: {message}" for message in _timeout_problems(defaults))
    claims_of: list[tuple[str, ...]] = []
    workspace = str(root) if root is not None else None
    for position, raw in enumerate(raw_tasks):
        if not isinstance(raw, dict):
            claims_of.append(())
            continue
        where = f"{name}: {labels[position]}"
        if "timeout" in raw:
            problems.extend(f"{where}: timeout: {message}" for message in _timeout_problems(raw))
        claims = raw.get("claims")
        claims_of.append(_claims(claims, where, workspace, problems, warnings) if claims else ())
    problems.extend(_graph_problems(name, raw_tasks, ids, labels, trusted=not schema_problems))
    if problems:
        raise PlanError(problems)
    tasks = tuple(
        _build_task(raw, defaults, claims) for raw, claims in zip(raw_tasks, claims_of, strict=True)
    )
    return Plan(tasks=tasks, source=source, sha256=sha256, warnings=tuple(warnings))


def title_from(prompt: str) -> str:
    """The first non-blank line of a prompt, trimmed to TITLE_WIDTH characters."""
    line = prompt.strip().split("\n", 1)[0].strip()
    return line if len(line) <= TITLE_WIDTH else line[: TITLE_WIDTH - 3].rstrip() + "..."


def normalise_claim(claim: str) -> str:
    """`./a//b/` -> `a/b`; ValueError (with the reason) for a path that is not inside the workspace."""
    if _PLAIN_CLAIM.fullmatch(claim) and not _DRIVE.match(claim):
        return claim  # the common case, without posixpath's work
    if "\x00" in claim:
        raise ValueError("contains a NUL character")
    if claim.startswith(("/", "\\")) or _DRIVE.match(claim):
        raise ValueError("is an absolute path; claims are relative to the workspace")
    if claim == "~" or claim.startswith("~/"):
        raise ValueError("starts at the home directory; claims are relative to the workspace")
    normal = posixpath.normpath(claim)
    if normal == ".":
        raise ValueError("names the workspace itself; claims name files")
    if normal == ".." or normal.startswith("../"):
        raise ValueError("climbs out of the workspace")
    return normal


# ---------------------------------------------------------------------------------------------
# parsing, with line and column for syntax errors


def _parse_toml(text: str, name: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
        if found:
            line, column = found.groups()
            raise PlanError([f"{name}:{line}:{column}: invalid TOML: {message[: found.start()]}"]) from None
        found = re.search(r"\s*\(at end of document\)$", message)
        if found:
            line = text.count("\n") + 1
            problem = f"{name}:{line}: invalid TOML: {message[: found.start()]} at end of file"
            raise PlanError([problem]) from None
        raise PlanError([f"{name}: invalid TOML: {message}"]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid TOML: {exc}"]) from None


def _parse_json(text: str, name: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise _DuplicateKey(key)
            result[key] = value
        return result

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise PlanError([f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]) from None
    except _DuplicateKey as exc:
        problem = f"{name}: invalid JSON: key {json.dumps(exc.key)} appears twice in one object"
        raise PlanError([problem]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid JSON: {exc}"]) from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _parse_yaml(text: str, name: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part) or "cannot parse"
        what = " ".join(what.split())
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        start = exc.context_mark
        if start is not None and mark is not None and start.line != mark.line:
            what += f" (it starts at line {start.line + 1}, column {start.column + 1})"
        raise PlanError([f"{where}: invalid YAML: {what}"]) from None
    except (YAMLError, ValueError, TypeError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError([f"{name}: invalid YAML: {first}"]) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    ".toml": _parse_toml,
    ".json": _parse_json,
    ".yaml": _parse_yaml,
    ".yml": _parse_yaml,
}
_TABLE_WORDS = {".toml": "table", ".json": "object", ".yaml": "mapping", ".yml": "mapping"}


def _workspace_of(plan_path: Path) -> Path:
    """The git repository holding the plan (nearest directory with a .git), else its directory."""
    start = plan_path.resolve().parent
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    return start


# ---------------------------------------------------------------------------------------------
# checks a schema cannot express


def _labels(ids: list[str | None]) -> list[str]:
    """How problems name each task: `task "id"` when it has a usable unique id, else `task #N`."""
    counts: dict[str, int] = {}
    for task_id in ids:
        if task_id is not None:
            counts[task_id] = counts.get(task_id, 0) + 1
    labels = []
    for number, task_id in enumerate(ids, start=1):
        # a usable id is letters, digits, ".", "_" and "-": nothing to escape inside the quotes
        if task_id is None:
            labels.append(f"task #{number}")
        elif counts[task_id] > 1:
            labels.append(f'task #{number} ("{task_id}")')
        else:
            labels.append(f'task "{task_id}"')
    return labels


def _usable_id(raw: Any) -> str | None:
    if isinstance(raw, dict):
        task_id = raw.get("id")
        if isinstance(task_id, str) and _ID.match(task_id):
            return task_id
    return None


def _at(name: str, labels: list[str], location: tuple[Any, ...], message: str) -> str:
    """'file: task "x": field: message' for a location inside the plan data."""
    parts = [name]
    rest = location
    if len(location) >= 2 and location[0] == "tasks" and isinstance(location[1], int):
        position = location[1]
        parts.append(labels[position] if 0 <= position < len(labels) else f"task #{position + 1}")
        rest = location[2:]
    fields = [_field_name(part) for part in rest if not isinstance(part, int) or isinstance(part, bool)]
    parts.extend(fields)
    parts.append(message)
    return ": ".join(parts)


def _field_name(key: Any) -> str:
    """A key as it appears in a problem: bare when it is a plain name, quoted otherwise."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return key
    return planschema.show(key) if isinstance(key, str) else repr(key)


def _timeout_problems(raw: dict[Any, Any]) -> list[str]:
    timeout = raw.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return []  # absent, or the schema reported it
    try:
        seconds = float(timeout)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        return [f"must be a finite number of seconds, not {planschema.show(timeout)}"]
    return []


def _claims(
    raw_claims: Any, where: str, workspace: str | None, problems: list[str], warnings: list[str]
) -> tuple[str, ...]:
    if not isinstance(raw_claims, list):
        return ()
    normalised: list[str] = []
    first_spelling: dict[str, str] = {}
    for claim in raw_claims:
        if not isinstance(claim, str) or not claim:
            continue  # the schema reported it
        try:
            normal = normalise_claim(claim)
        except ValueError as exc:
            problems.append(f"{where}: claims: {planschema.show(claim)} {exc}")
            continue
        if normal in first_spelling:
            if first_spelling[normal] != claim:  # exact repeats are the schema's uniqueItems problem
                problems.append(
                    f"{where}: claims: {planschema.show(claim)} and "
                    f"{planschema.show(first_spelling[normal])} name the same file"
                )
            continue
        first_spelling[normal] = claim
        normalised.append(normal)
        if claim.endswith("/") or (workspace is not None and os.path.isdir(os.path.join(workspace, normal))):
            warnings.append(
                f"{where}: claims: {planschema.show(normal)} is a directory; claims match exact file "
                "paths, so it protects no file inside it"
            )
    return tuple(normalised)


def _graph_problems(
    name: str, raw_tasks: list[Any], ids: list[str | None], labels: list[str], *, trusted: bool
) -> list[str]:
    """Duplicate ids, self-dependencies, unknown dependencies and cycles.

    `trusted`: the data passed the schema, so every dependency is already a well-formed id."""
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
        if not trusted:
            # well-formed ids only (the schema reported the rest), each once
            dependencies = list(
                dict.fromkeys(dep for dep in dependencies if isinstance(dep, str) and _ID.match(dep))
            )
        owns_edges = task_id is not None and first_at[task_id] == position
        for dependency in dependencies:
            if dependency == task_id:
                problems.append(f"{name}: {labels[position]}: depends_on: the task depends on itself")
            elif dependency not in first_at:
                hint = planschema.suggest(dependency, known)
                problems.append(f'{name}: {labels[position]}: depends_on: unknown task "{dependency}"{hint}')
            elif owns_edges:
                edges.setdefault(task_id, []).append(dependency)  # type: ignore[arg-type]
    for cycle in _cycles(known, edges):
        problems.append(f"{name}: dependency cycle: {' -> '.join(cycle)}")
    return problems


def _cycles(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of tasks, each written a -> b -> ... -> a from the
    group's first task in plan order (an edge a -> b means a depends on b)."""
    remaining = _after_peeling(nodes, edges)
    if not remaining:
        return []
    order = {node: position for position, node in enumerate(nodes)}
    cycles = []
    for component in _strongly_connected(sorted(remaining, key=order.__getitem__), edges):
        if len(component) < 2:
            continue
        members = set(component)
        start = min(component, key=order.__getitem__)
        cycles.append(_cycle_through(start, members, edges))
    cycles.sort(key=lambda cycle: order[cycle[0]])
    return cycles


def _after_peeling(nodes: list[str], edges: dict[str, list[str]]) -> set[str]:
    """Kahn's algorithm: the nodes left once every node without pending dependencies is removed.
    (Each node's edges are distinct: the schema or _graph_problems saw to that.)"""
    pending = {node: len(edges.get(node, ())) for node in nodes}
    dependents: dict[str, list[str]] = {}
    for node, targets in edges.items():
        for dependency in targets:
            dependents.setdefault(dependency, []).append(node)
    ready = [node for node, count in pending.items() if count == 0]
    while ready:
        node = ready.pop()
        del pending[node]
        for dependent in dependents.get(node, ()):
            pending[dependent] -= 1
            if pending[dependent] == 0:
                ready.append(dependent)
    return set(pending)


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (plans can be deep enough to overflow Python's stack)."""
    allowed = set(nodes)
    index_of: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index_of:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, next_edge = work.pop()
            if next_edge == 0:
                index_of[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            successors = [target for target in edges.get(node, ()) if target in allowed]
            descended = False
            for position in range(next_edge, len(successors)):
                target = successors[position]
                if target not in index_of:
                    work.append((node, position + 1))
                    work.append((target, 0))
                    descended = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index_of[target])
            if descended:
                continue
            if low[node] == index_of[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return components


def _cycle_through(start: str, members: set[str], edges: dict[str, list[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside one strongly connected group (BFS)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in edges.get(node, ()):
                if target not in members:
                    continue
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


def _build_task(raw: dict[str, Any], defaults: dict[str, Any], claims: tuple[str, ...]) -> PlanTask:
    values = {**defaults, **raw} if defaults else raw
    timeout = values.get("timeout")
    prompt: str = raw["prompt"]
    title = raw.get("title")
    return PlanTask(
        id=raw["id"],
        prompt=prompt,
        title=title.strip() if isinstance(title, str) else title_from(prompt),
        depends_on=tuple(raw.get("depends_on", ())),
        claims=claims,
        isolation=values.get("isolation") or "shared",
        pipeline=values.get("pipeline"),
        model=values.get("model"),
        timeout=float(timeout) if timeout is not None else None,
    )
