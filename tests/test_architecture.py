"""The layout is the architecture: layers from docs/architecture.md, no import cycles, small modules."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "stellafleet"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_MODULE_LINES = 600  # a ceiling, not a target: modules are split by concept
MAX_FUNCTION_LINES = 60
LAYER_ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]*)\|")


def layers_from_docs(text: str) -> dict[str, int]:
    """The layering table: `| layer | packages | ... |` rows, each package named in backticks."""
    ranks: dict[str, int] = {}
    for line in text.splitlines():
        row = LAYER_ROW.match(line)
        if row:
            for name in re.findall(r"`([A-Za-z_]+)/?(?:\.py)?`", row.group(2)):
                ranks[name] = int(row.group(1))
    return ranks


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


COMMAND_LINE = {"cli", "__main__"}  # top-level modules that are part of `commands/`


def package_of(module: str) -> str:
    """The unit a module belongs to: `stellafleet.run.waves` -> `run`, `stellafleet.cli` -> `commands`."""
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else "__init__"
    return "commands" if unit in COMMAND_LINE else unit


def sources() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every stellafleet module this file imports, wherever the import sits (TYPE_CHECKING included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        ours = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stellafleet")
        if ours and isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else str(node.module))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("stellafleet"))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = sources()
    known = set(modules)
    return {name: imports_of(path, known) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target in graph and target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_layering_table_names_every_package() -> None:
    ranks = layers_from_docs(ARCHITECTURE.read_text(encoding="utf-8"))
    packages = {package_of(name) for name in sources()} | COMMAND_LINE
    missing = sorted(packages - set(ranks))
    assert not missing, f"docs/architecture.md's layering table does not place: {', '.join(missing)}"


def test_no_module_imports_from_a_layer_above_it() -> None:
    ranks = layers_from_docs(ARCHITECTURE.read_text(encoding="utf-8"))
    upward = []
    for module, targets in import_graph().items():
        source = package_of(module)
        for target in sorted(targets):
            destination = package_of(target)
            if destination != source and ranks.get(destination, -1) <= ranks.get(source, -1):
                upward.append(f"{module} -> {target} (layer {ranks[source]} -> {ranks.get(destination)})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def test_there_are_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# The run's control and the dispatch know little: a feature is a step, a follow-up a request.
IMPORT_CEILINGS = {"stellafleet.run.control": 18, "stellafleet.run.dispatch": 10}


def test_the_control_and_the_dispatch_import_few_stellafleet_modules() -> None:
    graph = import_graph()
    for module, ceiling in IMPORT_CEILINGS.items():
        assert len(graph[module]) <= ceiling, f"{module} imports {sorted(graph[module])}"


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    """The walkers above must be able to fail: fed a cycle and an upward edge, they report them."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    ranks = layers_from_docs("| 2 | `run/` | x |\n| 10 | `core/`, `cli.py` | y |")
    assert ranks == {"run": 2, "core": 10, "cli": 10}


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)} has {lines} lines (limit {MAX_MODULE_LINES})"
    long = [
        f"{node.name} ({(node.end_lineno or node.lineno) - node.lineno + 1} lines)"
        for node in functions(ast.parse(text))
        if (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(REPO)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


# --- spend is checked in one module (core/spend.py) ---

# The engine, the pipelines and the worker only report into the spend module's tally and ask it about the
# guard; the fleet's control, dispatch and CI fix-ups ask its budget. None of them reads a guard, adds
# dollars up, compares them or formats them itself.
SPEND_REPORTERS = ("engine", "pipelines", "worker")
SPEND_ASKERS = ("run/control.py", "run/dispatch.py", "run/cifix.py", "run/steps/spend.py")
GUARD_NAMES = frozenset({"guard_usd", "spend_guard_usd"})
DOLLARS = re.compile(r"usd|spent|cost|guard", re.IGNORECASE)


def _mentions_dollars(node: ast.AST) -> bool:
    names = (
        sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        for sub in ast.walk(node)
    )
    return any(DOLLARS.search(name) for name in names)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _spend_finding(node: ast.AST, guard_names: frozenset[str]) -> str | None:
    named = (
        node.attr
        if isinstance(node, ast.Attribute)
        else node.id
        if isinstance(node, ast.Name)
        else node.arg
        if isinstance(node, ast.arg | ast.keyword)
        else None
    )
    if named in guard_names:
        return f"reads the guard ({named})"
    if isinstance(node, ast.AugAssign) and _mentions_dollars(node.target):
        return "adds dollars up"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _mentions_dollars(node):
        return None if _is_text(node.left) or _is_text(node.right) else "adds or subtracts dollars"
    if isinstance(node, ast.Compare) and not all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
        return "compares dollars" if _mentions_dollars(node) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"sum", "max", "min"}
    ):
        return "aggregates dollars" if any(_mentions_dollars(arg) for arg in node.args) else None
    if (
        isinstance(node, ast.FormattedValue)
        and node.format_spec is not None
        and _mentions_dollars(node.value)
    ):
        return "writes dollars without money()"
    return None


def spend_arithmetic(source: str, guard_names: frozenset[str] = GUARD_NAMES) -> list[str]:
    """Where source does spend's work itself: reads a guard, adds, compares or formats dollars."""
    found = []
    for node in ast.walk(ast.parse(source)):
        finding = _spend_finding(node, guard_names)
        if finding is not None:
            found.append(f"line {getattr(node, 'lineno', '?')}: {finding}")
    return sorted(found)


def test_spend_is_checked_in_the_spend_module_only() -> None:
    offenders = []
    for unit in SPEND_REPORTERS:
        for path in sorted((PACKAGE / unit).rglob("*.py")):
            offenders += [f"{path.relative_to(REPO)} {f}" for f in spend_arithmetic(path.read_text("utf-8"))]
    for rel in SPEND_ASKERS:
        source = (PACKAGE / rel).read_text("utf-8")
        offenders += [f"stellafleet/{rel} {f}" for f in spend_arithmetic(source, frozenset())]
    assert not offenders, "spend worked out outside core/spend.py:\n" + "\n".join(offenders)


def test_the_spend_check_sees_a_guard_compared_and_dollars_summed() -> None:
    """What the engine and the wrappers once did themselves is caught; reporting and asking is not."""
    assert spend_arithmetic("if self.spent.usd >= self.guard_usd:\n    stop()") == [
        "line 1: compares dollars",
        "line 1: reads the guard (guard_usd)",
    ]
    assert spend_arithmetic("self.usd += usd") == ["line 1: adds dollars up"]
    assert spend_arithmetic("extra = max(0.0, result.spend_usd - self.usd)") == [
        "line 1: adds or subtracts dollars",
        "line 1: aggregates dollars",
    ]
    assert spend_arithmetic("Engine(guard_usd=ctx.spend_guard_usd)") == [
        "line 1: reads the guard (guard_usd)",
        "line 1: reads the guard (spend_guard_usd)",
    ]
    assert spend_arithmetic('text = f"spent ${self.usd:.4f}"') == ["line 1: writes dollars without money()"]
    allowed = (
        "tally.add(pricer.cost(usage), steps=1)\n"
        "stop = tally.guard_reached('by its own cost report')\n"
        "if tally.guarded and pricer is None:\n    refuse()\n"
        "summary = f'{money(tally.usd)} spent' + note\n"
    )
    assert spend_arithmetic(allowed) == []


# The one process runner; testing/ holds the shipped fakes and test servers, which start processes of
# their own (a fake agent leaving a child behind, a Ray cluster in a network namespace) as tests need.
PROCESS_RUNNER = "stellafleet/proc/runner.py"
STARTS_PROCESSES_ITSELF = ("stellafleet/testing/",)
PROCESS_MODULES = {"subprocess", "plumbum"}
OS_STARTERS = re.compile(r"system|popen|spawn\w*|posix_spawnp?|exec\w+")


def process_starts(source: str) -> list[str]:
    """Each line where source imports subprocess or plumbum, names Popen, or starts a program through os."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""] + [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute):
            is_os = isinstance(node.value, ast.Name) and node.value.id == "os"
            names = [f"os.{node.attr}"] if is_os and OS_STARTERS.fullmatch(node.attr) else [node.attr]
        else:
            names = [node.id] if isinstance(node, ast.Name) else []
        found.update(
            (node.lineno, name)
            for name in names
            if name.split(".")[0] in PROCESS_MODULES or name == "Popen" or name.startswith("os.")
        )
    return [f"line {line}: {name}" for line, name in sorted(found)]


def test_every_process_starts_through_the_one_runner() -> None:
    starts = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel != PROCESS_RUNNER and not rel.startswith(STARTS_PROCESSES_ITSELF):
            starts += [f"{rel} {where}" for where in process_starts(path.read_text(encoding="utf-8"))]
    assert not starts, f"processes started beside {PROCESS_RUNNER}:\n" + "\n".join(starts)


def test_the_runner_check_sees_every_way_to_start_a_process() -> None:
    source = (
        "import subprocess\nfrom plumbum import local\nfrom subprocess import run\n"
        "import os\nos.system('x')\nos.execvp('x', [])\nproc: Popen\nos.getpid()\nsubprocess.run([])\n"
    )
    assert process_starts(source) == [
        "line 1: subprocess",
        "line 2: plumbum",
        "line 3: subprocess",
        "line 5: os.system",
        "line 6: os.execvp",
        "line 7: Popen",
        "line 9: subprocess",
    ]
    assert process_starts("import os, sys\nos.getpid()\nos.fork()\n") == []
