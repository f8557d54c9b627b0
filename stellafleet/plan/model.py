"""Plans: read a plan file (TOML, JSON, YAML by suffix; syntax errors carry line and column) or inline
prompts, check it whole, and hand back an immutable Plan."""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import posixpath
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from stellafleet.core.errors import PlanError, StellaError
from stellafleet.core.paths import EXCLUDED_DIRS, NotRegularFile, read_regular
from stellafleet.plan import schema as planschema
from stellafleet.plan.schema import TASK_ID, graph_problems, task_run_problems, text_problem

PLAN_SUFFIXES = (".toml", ".json", ".yaml", ".yml")
# Far above any real plan; reading stops there, so a path like /dev/zero is refused instead of read forever.
MAX_PLAN_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class PlanFile:
    """What a plan file holds, parsed; table_word is what the format calls a table (for messages)."""

    data: Any
    sha256: str
    table_word: str


def read_plan_file(path: str | Path) -> PlanFile:
    """Read and parse a plan file by its suffix; PlanError (with line and column) when it cannot."""
    name = str(path)
    plan_path = Path(path)
    suffix = plan_path.suffix.lower()
    if suffix not in PLAN_SUFFIXES:
        shown = f'"{plan_path.suffix}"' if plan_path.suffix else "(none)"
        raise PlanError([f"{name}: unknown plan format {shown}: use .toml, .json, .yaml or .yml"])
    raw, text = _read(plan_path, name)
    data = _PARSERS[suffix](text, name)
    return PlanFile(data, hashlib.sha256(raw).hexdigest(), _TABLE_WORDS[suffix])


def read_fragment_file(path: Path, name: str) -> PlanFile | None:
    """A fragment from $STELLA_PLAN_OUT (JSON when it starts with `{`, else TOML); None: none written."""
    if not path.exists():
        return None
    raw, text = _read(path, name, regular=True)
    suffix = ".json" if text.lstrip().startswith("{") else ".toml"
    return PlanFile(_PARSERS[suffix](text, name), hashlib.sha256(raw).hexdigest(), _TABLE_WORDS[suffix])


def _read(plan_path: Path, name: str, *, regular: bool = False) -> tuple[bytes, str]:
    """The file's bytes and its UTF-8 text (regular: only a regular file's, so that a FIFO a worker left
    never blocks the fleet); PlanError when it cannot be read as a plan."""
    try:
        if regular:
            raw = read_regular(plan_path, MAX_PLAN_BYTES + 1)
        else:
            with plan_path.open("rb") as stream:
                raw = stream.read(MAX_PLAN_BYTES + 1)
    except NotRegularFile:
        raise PlanError(
            [f"{name}: not a regular file (a FIFO, a device or a socket): write a plan file"]
        ) from None
    except FileNotFoundError:
        raise PlanError([f"{name}: no such file"]) from None
    except IsADirectoryError:
        raise PlanError([f"{name}: is a directory, not a plan file"]) from None
    except OSError as exc:
        raise PlanError([f"{name}: cannot read: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError([f"{name}: larger than {MAX_PLAN_BYTES // (1024 * 1024)} MiB: not a plan file"])
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PlanError([f"{name}:{line}: not UTF-8 text (byte {exc.start})"]) from None


def _parse_toml(text: str, name: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        problem = f"{name}: invalid TOML: {message}"
        if found := re.search(r"\s*\(at line (\d+), column (\d+)\)$", message):
            line, column = found.groups()
            problem = f"{name}:{line}:{column}: invalid TOML: {message[: found.start()]}"
        elif found := re.search(r"\s*\(at end of document\)$", message):
            line = text.count("\n") + 1
            problem = f"{name}:{line}: invalid TOML: {message[: found.start()]} at end of file"
        raise PlanError([problem]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid TOML: {exc}"]) from None


def _parse_json(text: str, name: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                problem = f"{name}: invalid JSON: key {json.dumps(key)} appears twice in one object"
                raise PlanError([problem])
            result[key] = value
        return result

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise PlanError([f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid JSON: {exc}"]) from None


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


TITLE_WIDTH = 72
_PLAIN_KEY = re.compile(r"[$A-Za-z0-9_.-]+")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class PlanTask:
    """One task of a plan, with defaults applied and claims normalised."""

    id: str
    prompt: str
    title: str
    depends_on: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    isolation: str = "shared"
    base: str = "pinned"  # an isolated task's start: "pinned", or "parents" (its dependencies' work on it)
    pipeline: str | None = None
    model: str | None = None
    timeout: float | None = None
    max_spend: float | None = None  # USD: this task's worker's guard is at most this
    expands: bool = False  # its worker may emit more tasks at run time (plan/fragment.py)
    check: str | None = None  # a shell command stella runs on the task's committed result (run/checking.py)
    check_timeout: float = 600.0
    check_rounds: int = 0  # follow-up attempts when the check is red
    check_fails_first: bool = False  # the check must fail on the start commit too
    locks: tuple[str, ...] = ()  # host-wide named locks held while it runs (run/steps/leases.py)
    ports: int | None = None  # ports leased to it (None: [resources] ports)
    parent: str | None = None  # the task that emitted this one (None: a task of the plan file)


@dataclass(frozen=True)
class Plan:
    """A checked plan: tasks in plan order; `source` and `sha256` say which file it came from."""

    tasks: tuple[PlanTask, ...]
    source: str | None = None
    sha256: str | None = None
    default_pipeline: str | None = None  # the plan's [defaults] pipeline, when it names one
    defaults: dict[str, Any] = field(default_factory=dict)  # its [defaults], under each fragment's own

    def unknown_pipelines(self, installed: Sequence[str]) -> list[str]:
        """A problem for each pipeline the plan names that is not installed, with the closest name."""
        name = self.source or "plan"
        choices = sorted(installed)

        def problem(where: str, pipeline: str) -> str:
            hint = planschema.suggest(pipeline, choices)
            return (
                f"{name}: {where}: pipeline: unknown pipeline {planschema.show(pipeline)}{hint}; "
                f"installed pipelines are {', '.join(choices) or 'none'}"
            )

        named = [("defaults", self.default_pipeline)] + [
            (f"task {json.dumps(task.id)}", task.pipeline)
            for task in self.tasks
            if task.pipeline != self.default_pipeline  # its own problem is the defaults' one
        ]
        return [
            problem(where, pipeline) for where, pipeline in named if pipeline and pipeline not in installed
        ]

    def start_of(self, task: PlanTask, base: str = "the pinned base") -> str | None:
        """Where an isolated task's worktree starts, as `plan show` and --dry-run say it (None: shared)."""
        if task.isolation != "isolated":
            return None
        if task.base == "parents" and task.depends_on:
            return f"parents: {', '.join(task.depends_on)}"
        return base

    def pinned_after_others(self) -> list[str]:
        """The isolated tasks that wait for others but start without their work (`plan check`'s hint)."""
        return [
            task.id
            for task in self.tasks
            if task.isolation == "isolated" and task.depends_on and task.base != "parents"
        ]

    def isolated_claims(self) -> list[str]:
        """The isolated tasks with claims (`plan check`'s hint: claims hold files of the task's own worktree,
        which no other task shares, so they keep no two tasks apart there)."""
        return [task.id for task in self.tasks if task.isolation == "isolated" and task.claims]

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

    def waves(self, max_concurrency: int, done: frozenset[str] = frozenset()) -> list[list[str]]:
        """Greedy waves of up to max_concurrency ready tasks in plan order; `done` tasks are in none."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        index = {task.id: position for position, task in enumerate(self.tasks)}
        waiting_on = [sum(dep not in done for dep in task.depends_on) for task in self.tasks]
        dependents: list[list[int]] = [[] for _ in self.tasks]
        for position, task in enumerate(self.tasks):
            for dependency in task.depends_on:
                dependents[index[dependency]].append(position)
        ready = [p for p, count in enumerate(waiting_on) if count == 0 and self.tasks[p].id not in done]
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


def load_plan(path: str | Path, *, root: Path | None = None) -> Plan:
    """Load and check a plan file; PlanError lists every problem. `root`: what claims are relative to."""
    read = read_plan_file(path)
    if root is None:  # the git repository holding the plan (nearest directory with a .git), else its own
        start = Path(path).resolve().parent
        root = next((folder for folder in (start, *start.parents) if (folder / ".git").exists()), start)
    return plan_from_data(
        read.data, source=str(path), sha256=read.sha256, root=root, table_word=read.table_word
    )


def plan_from_prompts(prompts: Sequence[str]) -> Plan:
    """Inline prompts as a plan of independent tasks t1, t2, ... titled by their first line."""
    problems = [
        f"prompt #{number}: {why}"
        for number, prompt in enumerate(prompts, start=1)
        # a command line's bytes that are not UTF-8 arrive as lone surrogates
        if (why := text_problem(prompt) if prompt.strip() else "must not be empty") is not None
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
    outside: frozenset[str] = frozenset(),
) -> Plan:
    """Check already-parsed plan data and build the Plan; dependencies may name tasks in `outside`."""
    name = source or "plan"
    raw_tasks: list[Any] = data.get("tasks") if isinstance(data, dict) else None  # type: ignore[assignment]
    ids = [_usable_id(raw) for raw in raw_tasks] if isinstance(raw_tasks, list) else []
    labels = _labels(ids)
    schema_problems = planschema.schema_problems(data, table_word=table_word)
    problems = [_at(name, labels, location, message) for location, message in schema_problems]
    if not isinstance(raw_tasks, list):
        raise PlanError(problems or [f"{name}: the plan has no tasks"])
    defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    problems.extend(_timeout_problems(f"{name}: defaults", defaults))
    problems.extend(task_run_problems(f"{name}: defaults", defaults, None))
    claims_of: list[tuple[str, ...]] = []
    workspace = str(root) if root is not None else None
    for position, raw in enumerate(raw_tasks):
        if not isinstance(raw, dict):
            continue  # the schema reported it, so no task is built
        where = f"{name}: {labels[position]}"
        isolation = raw.get("isolation", defaults.get("isolation"))
        problems.extend(task_run_problems(where, raw, isolation))
        if "base" in raw and isolation != "isolated":
            problems.append(
                f"{where}: base: only an isolated task has a base (a shared task works in the tree its "
                'dependencies committed to): remove it, or set isolation = "isolated"'
            )
        problems.extend(_timeout_problems(where, raw))
        claims_of.append(_claims(raw.get("claims"), where, workspace, problems))
    problems.extend(graph_problems(name, raw_tasks, ids, labels, outside))
    if problems:
        raise PlanError(problems)
    tasks = tuple(
        _build_task(raw, defaults, claims) for raw, claims in zip(raw_tasks, claims_of, strict=True)
    )
    pipeline = defaults.get("pipeline")
    return Plan(tasks=tasks, source=source, sha256=sha256, default_pipeline=pipeline, defaults=dict(defaults))


def title_from(prompt: str) -> str:
    """The first non-blank line of a prompt, trimmed to TITLE_WIDTH characters."""
    line = prompt.strip().split("\n", 1)[0].strip()
    return line if len(line) <= TITLE_WIDTH else line[: TITLE_WIDTH - 3].rstrip() + "..."


def normalise_claim(claim: str) -> str:
    """`./a//b/` -> `a/b`; ValueError (with the reason) for a path that is not inside the workspace."""
    if not claim.strip():
        raise ValueError("is blank: a claim names a file")
    why = text_problem(claim)
    if why is not None:
        raise ValueError(why)
    if claim.startswith(("/", "\\")) or _DRIVE.match(claim):
        raise ValueError("is an absolute path; claims are relative to the workspace")
    if _CONTROL.search(claim):
        raise ValueError("contains a control character (a newline, a tab, ...): a claim names a file")
    if "\\" in claim:
        raise ValueError("contains a backslash: separate the parts of a path with '/'")
    if claim == "~" or claim.startswith("~/"):
        raise ValueError("starts at the home directory; claims are relative to the workspace")
    normal = posixpath.normpath(claim)
    if normal == ".":
        raise ValueError("names the workspace itself; claims name files")
    if normal == ".." or normal.startswith("../"):
        raise ValueError("climbs out of the workspace")
    if ".git" in normal.split("/"):
        raise ValueError("is inside git's own directory (.git), which no task edits")
    if any(f"{normal}/".startswith(private) for private in EXCLUDED_DIRS):
        raise ValueError("is inside stella's private state (.stella/private, .stella/worktrees)")
    return normal


def _labels(ids: list[str | None]) -> list[str]:
    """How problems name each task: `task "id"` when it has a usable unique id, else `task #N`."""
    counts = Counter(task_id for task_id in ids if task_id is not None)
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
    task_id = raw.get("id") if isinstance(raw, dict) else None
    return task_id if isinstance(task_id, str) and TASK_ID.match(task_id) else None


def _at(name: str, labels: list[str], location: tuple[Any, ...], message: str) -> str:
    """'file: task "x": field: message' for a location inside the plan data."""
    parts = [name]
    rest = location
    if len(location) >= 2 and location[0] == "tasks" and isinstance(location[1], int):
        position = location[1]
        parts.append(labels[position] if 0 <= position < len(labels) else f"task #{position + 1}")
        rest = location[2:]
    # keys bare when they are plain names, quoted otherwise; list indexes are left out
    keys = [
        key if _PLAIN_KEY.fullmatch(key) else planschema.show(key) for key in rest if isinstance(key, str)
    ]
    return ": ".join([*parts, *keys, message])


def _timeout_problems(where: str, raw: dict[Any, Any]) -> list[str]:
    """That a timeout, a max_spend or a check_timeout is finite (TOML and YAML can write inf and nan)."""
    problems = []
    for key, unit in (("timeout", "seconds"), ("max_spend", "dollars"), ("check_timeout", "seconds")):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # absent, or the schema reported it
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            shown = planschema.show(value)
            problems.append(f"{where}: {key}: must be a finite number of {unit}, not {shown}")
    return problems


def _claims(raw_claims: Any, where: str, workspace: str | None, problems: list[str]) -> tuple[str, ...]:
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
            problems.append(
                f"{where}: claims: {planschema.show(normal)} is a directory; claims match exact file "
                "paths, so it would protect no file inside it: claim the files"
            )
    return tuple(normalised)


def _build_task(raw: dict[str, Any], defaults: dict[str, Any], claims: tuple[str, ...]) -> PlanTask:
    values = {**defaults, **raw}
    timeout, max_spend = values.get("timeout"), values.get("max_spend")
    prompt: str = raw["prompt"]
    title = raw.get("title")
    isolation = values.get("isolation") or "shared"
    return PlanTask(
        id=raw["id"],
        prompt=prompt,
        title=title.strip() if isinstance(title, str) else title_from(prompt),
        depends_on=tuple(raw.get("depends_on", ())),
        claims=claims,
        isolation=isolation,
        base=values.get("base", "pinned") if isolation == "isolated" else "pinned",
        pipeline=values.get("pipeline"),
        model=values.get("model"),
        timeout=float(timeout) if timeout is not None else None,
        max_spend=float(max_spend) if max_spend is not None else None,
        expands=raw.get("expands") is True,
        check=values.get("check"),
        check_timeout=float(values.get("check_timeout", 600.0)),
        check_rounds=int(values.get("check_rounds", 0)),
        check_fails_first=values.get("check_fails_first") is True,
        locks=tuple(values.get("locks", ())),
        ports=int(values["ports"]) if values.get("ports") is not None else None,
    )
