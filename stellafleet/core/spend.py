"""Spend: the boundary every spender reports through, running totals, and dollars written for people.

The engine and the pipelines report what each model call cost to a SpendReporter as it happens; the
fleet's worker lands each report in the ledger, a run outside a fleet only adds them up (NullSpend).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

# No honest report comes near these: a larger figure is a bug or an attack, and adding two of them up
# overflowed to infinity (two tasks reporting 1e308 made the run's spend `$inf`).
MAX_REPORT_USD = 100_000.0
MAX_REPORT_COUNT = 10**12


def check_usd(value: object, what: str = "spend_usd") -> float:
    """value as dollars when it is a finite, non-negative amount up to MAX_REPORT_USD; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a non-negative number of dollars, not {value!r}")
    if not (math.isfinite(value) and 0 <= value <= MAX_REPORT_USD):
        raise ValueError(
            f"{what} must be a non-negative number of dollars (at most {MAX_REPORT_USD:g}), not {value!r}"
        )
    return float(value)


def check_count(value: object, what: str) -> int:
    """value as a count (tokens, steps) when it is a whole number from 0 up to MAX_REPORT_COUNT."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPORT_COUNT:
        limit = f"whole, at most {MAX_REPORT_COUNT:,}"
        raise ValueError(f"{what} must be a non-negative number ({limit}), not {value!r}")
    return value


def check_report(
    usd: object, input_tokens: object, output_tokens: object, steps: object
) -> tuple[float, int, int, int]:
    """One spend report's amounts, each checked (check_usd, check_count); ValueError names the bad one."""
    return (
        check_usd(usd),
        check_count(input_tokens, "input_tokens"),
        check_count(output_tokens, "output_tokens"),
        check_count(steps, "steps"),
    )


class SpendReporter(Protocol):
    def add(self, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0) -> None: ...


class NullSpend:
    """A SpendReporter that only adds up, for runs outside a fleet."""

    def __init__(self) -> None:
        self.usd = 0.0
        self.input_tokens = 0
        self.output_tokens = 0
        self.steps = 0

    def add(self, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0) -> None:
        self.usd += usd
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.steps += steps

    def totals(self) -> dict[str, Any]:
        """The totals under a pipeline result's names (spend_usd, input_tokens, output_tokens, steps)."""
        return {
            "spend_usd": self.usd,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
        }


class TallySpend(NullSpend):
    """Passes each report on to another reporter and adds it up on the way (a wrapper's running totals)."""

    def __init__(self, inner: SpendReporter) -> None:
        super().__init__()
        self.inner = inner

    def add(self, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0) -> None:
        super().add(usd, input_tokens=input_tokens, output_tokens=output_tokens, steps=steps)
        self.inner.add(usd, input_tokens=input_tokens, output_tokens=output_tokens, steps=steps)


def money(usd: float | None) -> str:
    """Dollars for people, with the precision they have: `$1.50`, `$0.003`, `$0.0035`, `$0.015`; `-`
    when unknown. At least two decimals, up to four (a hundredth of a cent), since agent calls routinely
    cost fractions of a cent; a smaller amount that is not zero keeps two significant digits
    (`$0.000042`) rather than read as nothing. The dashboard's fmtUsd (observatory/static/app.js)
    writes amounts the same way."""
    if usd is None:
        return "-"
    if not math.isfinite(usd):
        return "$?"
    sign, value = ("-", -usd) if usd < 0 else ("", usd)
    decimals = 4
    if 0 < value < 0.00005:
        decimals = min(12, 1 - math.floor(math.log10(value)))
    whole, _, fraction = f"{value:.{decimals}f}".partition(".")
    fraction = fraction.rstrip("0").ljust(2, "0")
    if whole == "0" and fraction.strip("0") == "":
        sign = ""
    return f"{sign}${whole}.{fraction}"
