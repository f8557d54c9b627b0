"""Usage to dollars: genai-prices, config overrides, and each wire format's cache-token accounting."""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.core.pricing import Pricer, TokenUsage, price_for, unknown_price_message
from stellafleet.engine.clients import make_client
from stellafleet.engine.messages import UserText
from stellafleet.engine.settings import load_settings
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import ScriptedModelServer

CACHED_USAGE = {
    "input_tokens": 1_000_000,
    "output_tokens": 100_000,
    "cache_read_tokens": 400_000,
    "cache_write_tokens": 100_000,
}


def usage_over_the_wire(wire: str, model: str, usage: dict[str, int]) -> TokenUsage:
    """What the real client makes of a response carrying this usage, in this wire format."""
    with ScriptedModelServer([{"text": "hi", "usage": usage}]) as server:
        base = server.openai_base_url if wire == "openai" else server.anthropic_base_url
        config = Config({"engine": {"provider": wire, "model": model, "base_url": base}})
        client = make_client(load_settings(config, env={}), clock=FakeClock(), env={})
        try:
            reply = client.complete("system", [UserText("hello")], [], 100)
        finally:
            client.close()
        raw = server.requests[0].body
    assert raw["model"] == model
    return reply.usage


def test_openai_prompt_tokens_include_cached_ones() -> None:
    usage = usage_over_the_wire(
        "openai", "gpt-4o", {"input_tokens": 1000, "output_tokens": 10, "cache_read_tokens": 800}
    )
    assert usage == TokenUsage(input_tokens=1000, output_tokens=10, cache_read_tokens=800)
    pricer = price_for("gpt-4o", Config(), provider="openai")
    assert pricer is not None and pricer.source == "genai-prices"
    expected = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=1000, output_tokens=10, cache_read_tokens=800),
        "gpt-4o",
        provider_id="openai",
    ).total_price
    assert pricer.cost(usage) == pytest.approx(float(expected))
    # 200 uncached at $2.50/M + 800 cached at $1.25/M + 10 output at $10/M
    assert pricer.cost(usage) == pytest.approx((200 * 2.5 + 800 * 1.25 + 10 * 10) / 1e6)


def test_anthropic_input_tokens_exclude_cached_ones_and_are_added_back() -> None:
    usage = usage_over_the_wire(
        "anthropic",
        "claude-sonnet-4-5",
        CACHED_USAGE
        | {"input_tokens": 1000, "output_tokens": 10, "cache_read_tokens": 500, "cache_write_tokens": 200},
    )
    assert usage == TokenUsage(
        input_tokens=1000, output_tokens=10, cache_read_tokens=500, cache_write_tokens=200
    )
    pricer = price_for("claude-sonnet-4-5", Config(), provider="anthropic")
    assert pricer is not None
    expected = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=1000, output_tokens=10, cache_read_tokens=500, cache_write_tokens=200
        ),
        "claude-sonnet-4-5",
        provider_id="anthropic",
    ).total_price
    assert Decimal(str(pricer.cost(usage))) == pytest.approx(expected)


# OpenAI's usage has no count of cache writes: those tokens are billed as plain input.
@pytest.mark.parametrize(
    ("wire", "expected"), [("openai", 1.8 + 0.12 + 1.5), ("anthropic", 1.5 + 0.12 + 0.375 + 1.5)]
)
def test_cached_usage_is_priced_from_either_wire_format(wire: str, expected: float) -> None:
    config = Config(
        {
            "prices": {
                "house-model": {
                    "input_per_mtok": 3.0,
                    "output_per_mtok": 15.0,
                    "cache_read_per_mtok": 0.3,
                    "cache_write_per_mtok": 3.75,
                }
            }
        }
    )
    pricer = price_for("house-model", config)
    assert pricer is not None and pricer.source == "config"
    usage = usage_over_the_wire(wire, "house-model", CACHED_USAGE)
    # 500k uncached * $3 + 400k read * $0.30 + 100k written * $3.75 + 100k output * $15, per million
    assert pricer.cost(usage) == pytest.approx(expected)


def test_config_overrides_genai_prices_and_a_local_model_can_be_free() -> None:
    config = Config(
        {
            "prices": {
                "gpt-4o": {"input_per_mtok": 1, "output_per_mtok": 1},
                "llama3": {"input_per_mtok": 0, "output_per_mtok": 0},
            }
        }
    )
    assert price_for("gpt-4o", config, provider="openai").cost(
        TokenUsage(1_000_000, 1_000_000)
    ) == pytest.approx(2.0)  # type: ignore[union-attr]
    free = price_for("llama3", config)
    assert free is not None and free.cost(TokenUsage(5_000_000, 5_000_000)) == 0
    # cache prices default to the input price
    assert price_for("gpt-4o", config).cost(
        TokenUsage(1_000_000, 0, cache_read_tokens=1_000_000)
    ) == pytest.approx(1.0)  # type: ignore[union-attr]


def test_unknown_model_has_no_price_and_the_message_says_how_to_set_one() -> None:
    assert price_for("llama3", Config(), provider="openai") is None
    message = unknown_price_message("llama3")
    assert '[prices."llama3"]' in message and "input_per_mtok" in message and "output_per_mtok" in message
    assert ".stella/config.toml" in message


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"input_per_mtok": 1}, "output_per_mtok is missing"),
        ({"input_per_mtok": -1, "output_per_mtok": 1}, "must be a number >= 0"),
        ({"input_per_mtok": "cheap", "output_per_mtok": 1}, "must be a number >= 0"),
        (
            {"input_per_mtok": 1, "output_per_mtok": 1, "input": 2},
            'input is not a known key (did you mean "input_per_mtok"?)',
        ),
        ("3.0", "must be a table"),
    ],
)
def test_bad_price_tables_are_clear_errors(table: object, problem: str) -> None:
    with pytest.raises(StellaError) as raised:
        price_for("m", Config({"prices": {"m": table}}))
    assert problem in str(raised.value) and raised.value.exit_code == 2


def test_worst_case_is_the_whole_context_uncached_plus_every_output_token() -> None:
    pricer = Pricer(
        "m",
        override=price_for(
            "m", Config({"prices": {"m": {"input_per_mtok": 2, "output_per_mtok": 8}}})
        ).override,
    )  # type: ignore[union-attr]
    assert pricer.worst_case(500_000, 250_000) == pytest.approx(1.0 + 2.0)
