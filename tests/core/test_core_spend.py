"""The spend module: the guarded tally, the budget of guards, the settle, and dollars for people."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stellafleet.core.spend import (
    NoBudget,
    RunningTotal,
    SpendBudget,
    SpendTally,
    money,
    settle_attempt,
    spend_range,
    spend_stop_text,
)


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
        (1e308, "$1e+308"),  # a spend limit of 1e308 once printed 309 digits
        (999_999_999_999.0, "$999999999999.00"),
    ],
)
def test_money_keeps_the_precision_an_amount_has(usd: float | None, text: str) -> None:
    assert money(usd) == text


def test_a_tally_without_a_reporter_adds_up_under_the_result_names() -> None:
    spend = SpendTally()
    spend.add(0.25, input_tokens=100, output_tokens=10, steps=1)
    spend.add(0.5, input_tokens=50, steps=1)
    assert spend.totals() == {"spend_usd": 0.75, "input_tokens": 150, "output_tokens": 10, "steps": 2}


def test_a_tally_passes_every_report_on_and_keeps_its_own_totals() -> None:
    fleet = SpendTally()
    fleet.add(1.0, steps=3)  # spent before the wrapper started
    tally = SpendTally(fleet)
    tally.add(0.5, input_tokens=7, output_tokens=3, steps=1)
    tally.add(0.25, output_tokens=2)
    assert tally.totals() == {"spend_usd": 0.75, "input_tokens": 7, "output_tokens": 5, "steps": 1}
    assert fleet.totals() == {"spend_usd": 1.75, "input_tokens": 7, "output_tokens": 5, "steps": 4}


def test_a_report_its_reporter_refuses_is_not_counted() -> None:
    class Refusing:
        def add(self, usd: float, **counts: int) -> None:
            raise ValueError("refused")

    tally = SpendTally(Refusing())
    with pytest.raises(ValueError):
        tally.add(0.5, steps=1)
    assert tally.totals() == {"spend_usd": 0.0, "input_tokens": 0, "output_tokens": 0, "steps": 0}


def test_the_tally_answers_for_the_guard() -> None:
    free = SpendTally()
    free.add(50.0)
    assert not free.guarded and free.no_room_for(1e6) is None and free.guard_reached("x") is None
    assert free.guard_text() is None and free.cli_budget() is None
    tally = SpendTally(guard_usd=0.05)
    tally.add(0.03)
    assert tally.guarded and tally.no_room_for(0.02) is None  # exactly at the guard still fits
    assert tally.no_room_for(0.0201) == (
        "spent $0.03 of the $0.05 guard, and the next model call could cost up to $0.0201"
    )
    assert tally.guard_reached("by its own cost report") is None
    tally.add(0.02)
    assert tally.guard_reached("by its own cost report") == (
        "spend guard of $0.05 reached ($0.05 by its own cost report)"
    )
    assert tally.guard_text() == "$0.05"


def test_settle_reports_what_a_result_claims_beyond_the_reports_and_never_less() -> None:
    @dataclass
    class Result:
        spend_usd: float
        input_tokens: int = 0
        output_tokens: int = 0
        steps: int = 0

    sink = SpendTally()
    tally = SpendTally(sink)
    tally.add(0.10, input_tokens=100, steps=1)
    claimed = Result(0.25, input_tokens=150, output_tokens=20, steps=3)
    tally.settle(claimed)
    tally.settle(claimed)  # idempotent
    assert sink.totals() == {
        "spend_usd": pytest.approx(0.25),
        "input_tokens": 150,
        "output_tokens": 20,
        "steps": 3,
    }
    under = Result(0.01)
    tally.settle(under)
    assert under.spend_usd == pytest.approx(0.25) and under.steps == 3


def test_a_running_total_becomes_each_calls_step() -> None:
    session = RunningTotal()
    assert session.step(0.01, 0.01) == pytest.approx(0.01)
    assert session.step(0.03, 0.5) == pytest.approx(0.02)  # the running total wins over `cost`
    assert session.step(None, 0.004) == 0.004  # no total: the call's own cost
    assert session.step(0.001, 0.002) == 0.002  # a total that went down is not a step
    assert session.step(None, None) == 0.0


def test_settle_attempt_records_only_what_the_ledger_lacks() -> None:
    class FakeLedger:
        def __init__(self, recorded: float) -> None:
            self.recorded = recorded

        def of_attempt(self, attempt_id: int) -> float:
            return self.recorded

        def add(self, attempt_id: int, usd: float) -> bool:
            self.recorded += usd
            return True

    ledger = FakeLedger(0.25)
    assert settle_attempt(ledger, 1, (0.1, 0.4)) == pytest.approx(0.15)  # the most that was reported
    assert ledger.recorded == pytest.approx(0.4)
    assert settle_attempt(ledger, 1, (0.4 + 1e-12,)) == 0.0  # rounding, not lost money
    assert settle_attempt(ledger, 1, ()) == 0.0


def test_the_budget_hands_out_guards_until_too_little_is_left() -> None:
    budget = SpendBudget(1.0, 2, min_guard=0.1)
    assert budget.reserve("a") == 0.5 and budget.reserve("b") == 0.5
    with pytest.raises(
        NoBudget, match=r"\$1.00 of \$1.00 spent or held .* than the \$0.10 minimum guard left"
    ):
        budget.reserve("c")
    budget.release("a", 0.2)  # spent less than its guard: the rest of it is free again
    assert budget.reserve("c") == pytest.approx(0.3)  # what is left: 1 - 0.2 - 0.5 (held by b)
    budget.release("c", 0.1)
    budget.release("b", None)  # unknown: its whole guard counts
    assert budget.exhausted() is None and budget.reserve("d") == pytest.approx(0.2)  # 1 - 0.2 - 0.1 - 0.5
    budget.release("d", 0.15)
    assert budget.exhausted() is not None  # $0.05 left, under the minimum guard


def test_a_guard_exactly_the_minimum_still_starts() -> None:
    # binary-exact amounts: a guard of exactly min_guard_usd is enough, a cent less is not
    budget = SpendBudget(1.0, 4, min_guard=0.25)
    assert budget.exhausted() is None and budget.reserve("a") == 0.25  # per worker = the minimum
    left = SpendBudget(1.0, 1, min_guard=0.25, spent=0.75)
    assert left.exhausted() is None and left.reserve("a") == 0.25  # what is left = the minimum
    under = SpendBudget(1.0, 1, min_guard=0.25, spent=0.765625)
    assert under.exhausted() is not None
    with pytest.raises(NoBudget):
        under.reserve("a")


def test_the_before_start_check_stops_at_the_limit_and_says_so_once_asked() -> None:
    budget = SpendBudget(5.0, 2, min_guard=0.01)
    told: list[tuple[float, float]] = []
    assert budget.before_start(4.99, lambda spent, limit: told.append((spent, limit))) is None
    assert budget.before_start(5.12, lambda spent, limit: told.append((spent, limit))) == (
        "spend limit reached: $5.12 of $5.00"
    )
    assert told == [(5.12, 5.0)] and budget.reached(5.0) == spend_stop_text(5.0, 5.0)


@pytest.mark.parametrize(("n", "rank"), [(1, 1), (9, 9), (10, 9), (11, 10), (30, 27), (31, 28)])
def test_the_90th_percentile_is_the_nearest_rank(n: int, rank: int) -> None:
    assert spend_range(float(i) for i in range(1, n + 1))[1] == rank


def test_a_worker_that_spent_exactly_nothing_frees_its_whole_guard() -> None:
    budget = SpendBudget(1.0, 2, min_guard=0.1)
    assert budget.reserve("a") == 0.5 and budget.reserve("b") == 0.5
    budget.release("a", 0.0)  # $0 is a spend, not an unknown one: none of the guard counts
    assert budget.reserve("c") == 0.5
    budget.release("c", None)  # unknown: its whole guard counts
    assert budget.exhausted() is not None  # b holds its 0.5 and c's 0.5 counts: nothing is left


@pytest.mark.parametrize(
    ("limit", "concurrency", "starts"), [(0.04, 4, True), (0.039, 4, False), (0.005, 1, False)]
)
def test_a_limit_whose_share_per_worker_is_under_the_minimum_guard_stops_before_the_first_start(
    limit: float, concurrency: int, starts: bool
) -> None:
    """$0.039 over 4 workers is under $0.01 each: the run stops at its start, with one reason, before any
    task is admitted; exactly the minimum each starts."""
    budget = SpendBudget(limit, concurrency, min_guard=0.01)
    reason = budget.before_start(0.0)
    if starts:
        assert reason is None
        return
    assert reason is not None and reason.endswith("less than the $0.01 minimum guard left")
