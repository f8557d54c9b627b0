"""The spend guard: checked before every model call with room for one worst-case call."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine import engine_config, make_context, make_repo, transcript_records

from stellafleet.core.errors import StellaError
from stellafleet.pipelines.plain import PlainPipeline
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import ScriptedModelServer
from stellafleet.worker.main import LedgerSpend

# $1 per million input tokens, $2 per million output tokens.
PRICES = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
USAGE = {"input_tokens": 10_000, "output_tokens": 500}
PER_CALL = 10_000 * 1e-6 + 500 * 2e-6  # $0.011


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_guard_stops_before_the_call_that_could_cross_it(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root, guard=0.05)
    script = [{"repeat": 6, "tool_calls": [{"name": "git_status"}], "usage": USAGE}]
    # Before call n the worst case is about 10,500 tokens of context at $1/M plus 4,000 output tokens at
    # $2/M = $0.0185: calls 1-3 fit under $0.05 ($0.033 + $0.0185 = $0.0515 does not): call 4 is never made.
    config = engine_config(server := ScriptedModelServer(script), wire, prices=PRICES, max_output_tokens=4000)
    spend = LedgerSpend(ctx)
    with server:
        result = PlainPipeline().run(ctx, config, spend, clock=FakeClock(), env={})
    spend.close()
    assert len(server.requests) == 3
    assert not result.success
    assert (
        "spend guard" in result.summary
        and "spent $0.033 of the $0.05 guard, and the next model call could cost up to $0.0185"
        in result.summary
    )
    assert result.spend_usd == pytest.approx(3 * PER_CALL)
    with Ledger.open(root / ".stella/private/fleet.db", readonly=True) as ledger:
        attempt = ledger.get_run(ctx.run_id)["attempts"][0]
    assert attempt["spend_usd"] == pytest.approx(3 * PER_CALL) and attempt["spend_usd"] <= 0.05
    assert (attempt["input_tokens"], attempt["output_tokens"], attempt["steps"]) == (30_000, 1_500, 3)
    assert transcript_records(ctx)[-1]["stop"] == "spend_guard"
    assert result.summary.startswith("stopped by the spend guard after 3 steps: ")
    # what to change for the worker to go on
    assert result.summary.endswith(
        "; to let it go on, lower [engine] max_output_tokens (now 4000), raise the spend limit, or run "
        "fewer workers at once (each worker's guard is the limit divided by the concurrency)"
    )


def test_a_guard_stop_after_one_step_says_1_step(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root, guard=0.025)  # call 1 fits; $0.011 + $0.0185 for call 2 does not
    script = [{"repeat": 3, "tool_calls": [{"name": "git_status"}], "usage": USAGE}]
    config = engine_config(
        server := ScriptedModelServer(script), "openai", prices=PRICES, max_output_tokens=4000
    )
    with server:
        result = PlainPipeline().run(ctx, config, LedgerSpend(ctx), clock=FakeClock(), env={})
    assert len(server.requests) == 1
    assert result.summary.startswith(
        "stopped by the spend guard after 1 step: spent $0.011 of the $0.025 guard"
    )


def test_guard_counts_the_whole_context_of_the_next_call(tmp_path: Path) -> None:
    """A first call whose prompt alone could cost more than the guard is never made."""
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root, guard=0.001, prompt="x" * 30_000)  # ~10,000 tokens at $1/M = $0.01
    config = engine_config(server := ScriptedModelServer([]), "openai", prices=PRICES, max_output_tokens=10)
    with server:
        result = PlainPipeline().run(ctx, config, LedgerSpend(ctx), clock=FakeClock(), env={})
    assert server.requests == [] and not result.success and result.spend_usd == 0


def test_a_guard_without_a_known_price_refuses_before_anything_runs(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root, guard=1.0)
    config = engine_config(server := ScriptedModelServer([]), "openai", model="my-local-llama")
    with server, pytest.raises(StellaError) as raised:
        PlainPipeline().run(ctx, config, LedgerSpend(ctx), clock=FakeClock(), env={})
    assert raised.value.exit_code == 2
    assert '[prices."my-local-llama"]' in str(raised.value) and "input_per_mtok" in str(raised.value)
    assert server.requests == []
    problem = PlainPipeline().preflight(config, spend_limited=True, env={})
    assert problem is not None and '[prices."my-local-llama"]' in problem
    assert PlainPipeline().preflight(config, spend_limited=False, env={}) is None
    assert PlainPipeline().preflight(config, env={"STELLA_SPEND_LIMIT": "5"}) == problem
