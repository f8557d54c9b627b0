"""The spend boundary: running totals, passing reports on, and dollars written for people."""

from __future__ import annotations

import pytest

from stellafleet.core.spend import NullSpend, TallySpend, money


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (None, "-"),
        (0.0, "$0.00"),
        (1.0, "$1.00"),
        (1.5, "$1.50"),
        (12.345, "$12.345"),
        (0.003, "$0.003"),  # a real aider call
        (0.0035, "$0.0035"),  # a real codex task
        (0.015, "$0.015"),  # a limit of 0.015 once printed as $0.01
        (0.004, "$0.004"),
        (0.12345, "$0.1235"),
        (0.000042, "$0.000042"),  # under a hundredth of a cent still reads as something
        (-0.5, "-$0.50"),
        (float("inf"), "$?"),
        (float("nan"), "$?"),
    ],
)
def test_money_keeps_the_precision_an_amount_has(usd: float | None, text: str) -> None:
    assert money(usd) == text


def test_null_spend_adds_up_under_the_result_names() -> None:
    spend = NullSpend()
    spend.add(0.25, input_tokens=100, output_tokens=10, steps=1)
    spend.add(0.5, input_tokens=50, steps=1)
    assert spend.totals() == {"spend_usd": 0.75, "input_tokens": 150, "output_tokens": 10, "steps": 2}


def test_tally_spend_passes_every_report_on_and_keeps_its_own_totals() -> None:
    fleet = NullSpend()
    fleet.add(1.0, steps=3)  # spent before the wrapper started
    tally = TallySpend(fleet)
    tally.add(0.5, input_tokens=7, output_tokens=3, steps=1)
    tally.add(0.25, output_tokens=2)
    assert tally.totals() == {"spend_usd": 0.75, "input_tokens": 7, "output_tokens": 5, "steps": 1}
    assert fleet.totals() == {"spend_usd": 1.75, "input_tokens": 7, "output_tokens": 5, "steps": 4}
