"""Property tests: whatever a plan file holds, checking it ends in a Plan or a PlanError, nothing else."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stellafleet.core.errors import PlanError
from stellafleet.plan.model import PLAN_SUFFIXES, load_plan, plan_from_data

# What TOML, JSON and YAML parsers can hand over.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.dates()
    | st.datetimes()
    | st.times()
)
keys = st.text(max_size=10) | st.integers() | st.none() | st.booleans() | st.dates()
junk: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)
task_ids = st.sampled_from(["a", "b", "c", "schema", "shema", "reader", "x y", "", "-", "a" * 129]) | st.text(
    max_size=6
)
id_lists = st.lists(task_ids, max_size=4)
task = st.fixed_dictionaries(
    {},
    optional={
        "id": task_ids | junk,
        "prompt": st.sampled_from(["Do the thing", "", " \n ", "First\nSecond"]) | junk,
        "title": st.text(max_size=8) | junk,
        "depends_on": id_lists | task_ids | junk,
        "claims": st.lists(
            st.sampled_from(["a", "./a//b", "/etc/x", "../x", "a/../..", "~/x", "C:\\x", "src/", "", "."])
            | st.text(max_size=8),
            max_size=4,
        )
        | junk,
        "isolation": st.sampled_from(["shared", "isolated", "Isolated"]) | junk,
        "pipeline": st.sampled_from(["plain", "command", "no such"]) | junk,
        "model": st.text(max_size=5) | junk,
        "timeout": st.sampled_from([1, 2.5, 0, -1, float("inf"), float("nan"), 10**400]) | junk,
        "depend_on": junk,
        "titel": junk,
    },
)
defaults = st.fixed_dictionaries(
    {},
    optional={
        "pipeline": st.text(max_size=5) | junk,
        "model": junk,
        "isolation": st.sampled_from(["shared", "isolated", "x"]) | junk,
        "timeout": junk,
        "modle": junk,
    },
)
plans = st.fixed_dictionaries(
    {},
    optional={
        "tasks": st.lists(task | junk, max_size=6) | junk,
        "defaults": defaults | junk,
        "$schema": junk,
        "task": junk,
    },
)
anything = plans | junk


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=anything)
def test_data_level_loader_raises_only_plan_errors(data: Any) -> None:
    try:
        plan = plan_from_data(data, source="fuzz.toml")
    except PlanError as exc:
        assert exc.problems, "a PlanError always lists its problems"
        for problem in exc.problems:
            assert problem.startswith("fuzz.toml"), problem
            assert "Traceback" not in problem and "\n" not in problem, problem
        return
    # accepted: then it really is a well-formed plan
    ids = [t.id for t in plan.tasks]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", task_id) for task_id in ids)
    assert all(t.prompt.strip() and t.isolation in ("shared", "isolated") for t in plan.tasks)
    waves = plan.waves(2)
    assert sorted(task_id for wave in waves for task_id in wave) == sorted(ids)


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(min_value=1, max_value=25))
    tasks = []
    for number in range(count):
        deps = draw(st.sets(st.integers(min_value=0, max_value=number - 1), max_size=3)) if number else set()
        tasks.append(
            {"id": f"n{number}", "prompt": f"step {number}", "depends_on": [f"n{d}" for d in sorted(deps)]}
        )
    order = draw(st.permutations(tasks))
    return {"tasks": list(order)}


@settings(max_examples=300, deadline=None)
@given(data=dags(), width=st.integers(min_value=1, max_value=6))
def test_waves_respect_dependencies_and_width(data: dict[str, Any], width: int) -> None:
    plan = plan_from_data(data)
    waves = plan.waves(width)
    wave_of = {task_id: number for number, wave in enumerate(waves) for task_id in wave}
    assert len(wave_of) == len(plan.tasks)
    order = {task_id: position for position, task_id in enumerate(plan.ids)}
    for wave in waves:
        assert 1 <= len(wave) <= width
        assert wave == sorted(wave, key=order.__getitem__), "a wave lists its tasks in plan order"
    for planned in plan.tasks:
        for dependency in planned.depends_on:
            assert wave_of[dependency] < wave_of[planned.id]


texts = st.text(max_size=60) | st.sampled_from(
    ['[[tasks]]\nid = "a"\nprompt = "p"\n', '{"tasks": [{"id": "a", "prompt": "p"}]}', "tasks:\n  - id: a\n"]
).flatmap(lambda base: st.integers(0, len(base)).map(lambda cut: base[:cut]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, suffix=st.sampled_from(PLAN_SUFFIXES))
def test_file_loader_raises_only_plan_errors(tmp_path: Path, text: str, suffix: str) -> None:
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(text.encode("utf-8", errors="replace"))  # lone surrogates cannot be UTF-8
    try:
        load_plan(path)
    except PlanError as exc:
        assert all(problem.startswith(str(path)) for problem in exc.problems)


def test_dates_and_times_are_type_problems() -> None:
    try:
        plan_from_data({"tasks": [{"id": "a", "prompt": datetime.time(1, 2)}]}, source="p.yaml")
    except PlanError as exc:
        assert exc.problems == ['p.yaml: task "a": prompt: must be a string, not a date/time (01:02:00)']
    else:
        raise AssertionError("a time is not a prompt")
