"""Spend: the boundary every spender reports through, running totals, and dollars written for people.

The engine and the pipelines report what each model call cost to a SpendReporter as it happens; the
fleet's worker lands each report in the ledger, a run outside a fleet only adds them up (NullSpend).
"""

from __future__ import annotations

from typing import Any, Protocol


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


def money(usd: float | None, *, precise: bool = False) -> str:
    """Dollars for people: `$1.50`, or `-` when unknown.

    precise: up to four decimals without trailing zeros (`$0.0042`, `$1.5`, `$0`), for the small sums
    one agent spends, which whole cents would round away.
    """
    if usd is None:
        return "-"
    if not precise:
        return f"${usd:.2f}"
    return f"${usd:.4f}".rstrip("0").rstrip(".") if usd else "$0"
