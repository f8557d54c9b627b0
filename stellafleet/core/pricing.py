"""Token usage to dollars: genai-prices' table, overridable per model under `[prices."MODEL"]`."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

from stellafleet.core.config import Config
from stellafleet.core.configsections import PriceConfig
from stellafleet.core.errors import StellaError

_PER = 1_000_000


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


class Pricer:
    """Prices one model's usage in dollars: at its `[prices."MODEL"]` when configured, else genai-prices'."""

    def __init__(self, model: str, *, override: PriceConfig | None = None, provider: str | None = None):
        self.model = model
        self.override = override
        self.provider = provider
        self.source = "config" if override else "genai-prices"

    def cost(self, usage: TokenUsage) -> float:
        if self.override is not None:
            p = self.override
            cache_read, cache_write = p.cache_read_per_mtok, p.cache_write_per_mtok
            uncached = max(usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens, 0)
            return (  # the cache prices default to the input price
                uncached * p.input_per_mtok
                + usage.cache_read_tokens * (p.input_per_mtok if cache_read is None else cache_read)
                + usage.cache_write_tokens * (p.input_per_mtok if cache_write is None else cache_write)
                + usage.output_tokens * p.output_per_mtok
            ) / _PER
        calc = _calc(self.model, self.provider, usage)
        if calc is None:
            raise StellaError(f"no price known for model {self.model!r}")
        return calc

    def worst_case(self, context_tokens: int, max_output_tokens: int) -> float:
        """The most one call can cost: the whole context uncached, and every output token used."""
        return self.cost(TokenUsage(input_tokens=context_tokens, output_tokens=max_output_tokens))


def _calc(model: str, provider: str | None, usage: TokenUsage) -> float | None:
    import genai_prices  # its price table takes a tenth of a second to load: only when asked

    genai_usage = genai_prices.Usage(**usage.to_json())
    attempts: list[dict[str, Any]] = [{"provider_id": provider}] if provider else []
    attempts.append({})
    for kwargs in attempts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return float(genai_prices.calc_price(genai_usage, model, **kwargs).total_price)
        except (LookupError, ValueError):
            continue
    return None


def price_for(model: str, config: Config, *, provider: str | None = None) -> Pricer | None:
    """A Pricer for model (config override first, then genai-prices), or None when no price is known."""
    prices = config.prices.get(model)
    if prices is not None:
        return Pricer(model, override=prices)
    if _calc(model, provider, TokenUsage(input_tokens=1, output_tokens=1)) is None:
        return None
    return Pricer(model, provider=provider)


def unknown_price_message(model: str, settings_file: str = ".stella/config.toml") -> str:
    """How to set a price (in settings_file), for a model neither the config nor genai-prices knows."""
    return (
        f"no price known for model {model!r} and a spend limit is set: add its price to "
        f'{settings_file} as [prices."{model}"] with input_per_mtok = ... and output_per_mtok = ... '
        "(dollars per million tokens; 0 and 0 for a free local model)"
    )
