"""The bundled plan JSON Schema: one file in two places, valid, and the compiled check agrees with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stellafleet.core.schemacheck import SchemaCompiler
from stellafleet.plan import schema as planschema

REPO = Path(__file__).resolve().parents[2]
CANONICAL = REPO / "stellafleet" / "plan" / "plan.schema.json"
COPY = REPO / "schemas" / "plan.schema.json"


def test_repository_copy_is_byte_identical_to_the_shipped_schema() -> None:
    assert COPY.read_bytes() == CANONICAL.read_bytes(), (
        "schemas/plan.schema.json must be a byte-for-byte copy of stellafleet/plan/plan.schema.json: "
        "cp stellafleet/plan/plan.schema.json schemas/plan.schema.json"
    )


def test_schema_is_draft_2020_12_with_an_id() -> None:
    schema = json.loads(CANONICAL.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("https://")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert planschema.schema_text() == CANONICAL.read_text(encoding="utf-8")


def test_examples_validate_with_plain_jsonschema() -> None:
    validator = jsonschema.Draft202012Validator(planschema.schema())
    plan = json.loads((REPO / "examples" / "feature-buildout.json").read_text(encoding="utf-8"))
    validator.validate(plan)
    assert planschema.is_valid(plan)


def test_compiler_refuses_keywords_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="oneOf"):
        SchemaCompiler({}).compile({"oneOf": [{"type": "string"}]})


ids = st.sampled_from(["a", "b", "schema", "x y", "", "a" * 130, "t-1.2_3"])
values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | ids,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ids, inner, max_size=3),
    max_leaves=6,
)
field_values = {
    "id": ids | values,
    "prompt": st.sampled_from(["do it", "", "  ", "x"]) | values,
    "title": st.sampled_from(["T", " "]) | values,
    "depends_on": st.lists(ids, max_size=3) | values,
    "claims": st.lists(st.sampled_from(["a", "./a", "/abs", "", "b/c"]), max_size=3) | values,
    "isolation": st.sampled_from(["shared", "isolated", "isolate"]) | values,
    "pipeline": st.sampled_from(["plain", "claude-code", "bad name"]) | values,
    "model": st.sampled_from(["gpt", ""]) | values,
    "timeout": st.sampled_from([1, 0.5, 0, -1, True]) | values,
}
task_like = st.fixed_dictionaries({}, optional={**field_values, "junk": values, "depend_on": values})
plan_like = st.fixed_dictionaries(
    {},
    optional={
        "tasks": st.lists(task_like | values, max_size=4) | values,
        "defaults": st.fixed_dictionaries({}, optional={k: field_values[k] for k in ("isolation", "timeout")})
        | values,
        "$schema": values,
        "extra": values,
    },
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_like | values)
def test_compiled_check_never_accepts_what_jsonschema_rejects(data: Any) -> None:
    validator = jsonschema.Draft202012Validator(planschema.schema())
    if planschema.is_valid(data):
        assert validator.is_valid(data), f"compiled check accepted an invalid plan: {data!r}"
    elif validator.is_valid(data):
        # allowed (the compiled check is conservative) but only for non-string repeated items
        assert planschema.schema_problems(data) == []
