"""The bundled plan JSON Schema: one file in two places, valid, and the examples pass it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

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
    assert planschema.BUNDLED.text == CANONICAL.read_text(encoding="utf-8")


def test_examples_validate_with_plain_jsonschema() -> None:
    validator = jsonschema.Draft202012Validator(planschema.BUNDLED.data)
    plan = json.loads((REPO / "examples" / "feature-buildout.json").read_text(encoding="utf-8"))
    validator.validate(plan)
    assert planschema.schema_problems(plan) == []
