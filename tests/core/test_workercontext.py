"""A worker learns its task from its environment, and refuses clearly outside a fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from stellafleet.core.errors import StellaError
from stellafleet.core.workercontext import WorkerContext


def make_context(tmp_path: Path) -> WorkerContext:
    return WorkerContext(
        root=tmp_path,
        workspace=tmp_path / "wt",
        run_id="r-20261130-120000-abcd",
        task_id="docs",
        task_title="Rewrite the receipts page",
        attempt_id=7,
        prompt="Rewrite docs/receipts.md\nwith care",
        isolation="isolated",
        branch="fleet/docs-0123456789abcdef",
        base_commit="f" * 40,
        spend_guard_usd=1.5,
        pipeline="command",
        model=None,
        timeout_s=30.0,
        result_path=tmp_path / "result.json",
        log_path=tmp_path / "docs.log",
        transcript_path=tmp_path / "docs.jsonl",
    )


def test_round_trip_through_the_environment(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    env = ctx.to_env()
    assert env["STELLA_PROMPT"] == "Rewrite docs/receipts.md\nwith care"
    assert env["STELLA_SPEND_GUARD"] == "1.500000"
    assert "STELLA_TASK_MODEL" not in env and "STELLA_MODEL" not in env
    assert WorkerContext.from_env(env) == ctx


def test_outside_a_worker_is_a_clear_error() -> None:
    with pytest.raises(StellaError, match="not inside a fleet worker"):
        WorkerContext.from_env({})


def test_bad_attempt_id(tmp_path: Path) -> None:
    env = make_context(tmp_path).to_env()
    env["STELLA_ATTEMPT_ID"] = "seven"
    with pytest.raises(StellaError, match="STELLA_ATTEMPT_ID is not a number"):
        WorkerContext.from_env(env)
