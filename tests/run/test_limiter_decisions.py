"""run/limiter.py, what it decides: the exact halving and growth steps, which limit holds or stops, for how
long, and the rows and notices it leaves (docs/fleet.md "Provider limits")."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stellafleet.core.limits import FAR_RESET_S, LimitEvent, LimitKind, Width, from_text, reset_text
from stellafleet.core.status import StopReason
from stellafleet.run.events import Notice
from stellafleet.run.limiter import Limiter, LimitPolicy
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.sample_ledger import add_run

RUN = "r-limit-steps"


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    opened = Ledger.open(tmp_path / "fleet.db")
    add_run(opened, RUN, max_concurrency=4)
    yield opened
    opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time())


def limit(
    ledger: Ledger,
    kind: LimitKind,
    reset_in: float | None,
    now: float,
    *,
    task: str | None = "t",
    attempt: int | None = None,
    message: str = "limited",
) -> None:
    reset = None if reset_in is None else int((now + reset_in) * 1000)
    event = LimitEvent(kind, "engine", 429, reset, message)
    ledger.limits.add(RUN, event, task_id=task, attempt_id=attempt)


def fleet_rows(ledger: Ledger) -> list[tuple[int, str]]:
    return [
        (row["concurrency"], row["message"]) for row in ledger.limits.of_run(RUN) if row["source"] == "fleet"
    ]


@pytest.mark.parametrize(
    ("ceiling", "halvings"), [(8, [4, 2, 1, 1]), (5, [2, 1, 1]), (3, [1, 1]), (1, [1]), (0, [1])]
)
def test_each_rate_limit_halves_the_width_rounding_down_never_below_one(
    ceiling: int, halvings: list[int]
) -> None:
    width = Width(ceiling)
    assert width.value == max(1, ceiling)
    assert [width.lower() for _ in halvings] == halvings


def test_each_limit_free_end_grows_the_width_by_one_up_to_the_ceiling() -> None:
    width = Width(4)
    width.lower(), width.lower()
    assert [width.grow() for _ in range(4)] == [2, 3, 4, 4]


def test_the_width_grows_only_after_an_attempt_that_met_no_limit(ledger: Ledger, clock: FakeClock) -> None:
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    limit(ledger, LimitKind.RATE, 1.0, clock.now(), attempt=7)
    assert limiter.width() == 2
    rows = limiter.attempt_ended(7)  # the attempt that itself hit the limit: no growth
    assert [row["kind"] for row in rows] == ["rate"] and limiter.width() == 2
    assert limiter.attempt_ended(8) == [] and limiter.width() == 3
    limiter.attempt_ended(9)
    limiter.attempt_ended(10)  # at the ceiling already: neither a change nor a row
    assert limiter.width() == 4
    assert [width for width, _ in fleet_rows(ledger)] == [2, 3, 4]
    assert fleet_rows(ledger)[1][1] == "grew to 3 after a task ended without a limit"


def test_a_rate_limit_at_width_one_keeps_it_and_says_so(ledger: Ledger, clock: FakeClock) -> None:
    seen: list[object] = []
    limiter = Limiter(ledger, RUN, 1, clock=clock, wall=clock.now, emit=seen.append)
    limit(ledger, LimitKind.RATE, None, clock.now(), task=None)
    assert limiter.width() == 1 and limiter.hold_s() == 0.0  # no reset named: no hold
    message = "kept at 1 after a rate limit in task ? (reset unknown)"
    assert fleet_rows(ledger) == [(1, message)]
    assert seen == [Notice(f"provider limits: {message}")]


def test_the_hold_ends_at_the_reset_of_the_most_recent_limit_nearer_or_further(
    ledger: Ledger, clock: FakeClock
) -> None:
    """docs/fleet.md: new starts wait until the latest reset the fleet was told: the provider's newest
    answer, so a later limit with a nearer reset shortens the hold and a further one lengthens it."""
    limiter = Limiter(ledger, RUN, 8, clock=clock, wall=clock.now)
    limit(ledger, LimitKind.RATE, 30.0, clock.now(), task="far")
    assert limiter.hold_s() == pytest.approx(30.0, abs=0.01)
    limit(ledger, LimitKind.RATE, 5.0, clock.now(), task="near")
    assert limiter.hold_s() == pytest.approx(5.0, abs=0.01) and limiter.width() == 2
    limit(ledger, LimitKind.RATE, None, clock.now(), task="unnamed")  # no reset named: the hold stays
    assert limiter.hold_s() == pytest.approx(5.0, abs=0.01) and limiter.width() == 1
    limit(ledger, LimitKind.RATE, 60.0, clock.now(), task="further")
    assert limiter.hold_s() == pytest.approx(60.0, abs=0.01) and limiter.width() == 1
    assert "in task near (resets " in fleet_rows(ledger)[1][1]
    limiter.wait_out_hold()
    assert clock.sleeps == [pytest.approx(60.0, abs=0.01)] and limiter.hold_s() == 0.0
    limiter.wait_out_hold()  # nothing held: no wait
    assert len(clock.sleeps) == 1
    limit(ledger, LimitKind.RATE, 0.5, clock.now())
    limiter.wait_out_hold()  # under a second is waited out too
    assert clock.sleeps[1:] == [pytest.approx(0.5, abs=0.01)]


def test_a_workers_own_hold_is_the_reset_of_the_runs_most_recent_rate_limit(
    ledger: Ledger, clock: FakeClock
) -> None:
    """The reset every engine worker waits out before its next call is the same one the fleet holds to."""
    assert ledger.limits.latest_rate_reset_ms(RUN) is None
    limit(ledger, LimitKind.RATE, 30.0, 1000.0)
    limit(ledger, LimitKind.RATE, 5.0, 1000.0)
    assert ledger.limits.latest_rate_reset_ms(RUN) == 1_005_000  # nearer and newer: it is the hold
    limit(ledger, LimitKind.RATE, None, 1000.0)  # names no reset: the hold stays
    limit(ledger, LimitKind.USAGE, 7200.0, 1000.0)  # a usage limit is no rate hold
    add_run(ledger, "r-other")
    ledger.limits.add("r-other", LimitEvent(LimitKind.RATE, "engine", 429, 9_999_999, "other run"))
    assert ledger.limits.latest_rate_reset_ms(RUN) == 1_005_000
    limit(ledger, LimitKind.RATE, 60.0, 1000.0)
    assert ledger.limits.latest_rate_reset_ms(RUN) == 1_060_000


def test_each_row_is_taken_once(ledger: Ledger, clock: FakeClock) -> None:
    limiter = Limiter(ledger, RUN, 8, clock=clock, wall=clock.now)
    limit(ledger, LimitKind.RATE, 1.0, clock.now())
    assert [limiter.width(), limiter.width(), limiter.width()] == [4, 4, 4]
    limit(ledger, LimitKind.RATE, 1.0, clock.now())
    assert limiter.width() == 2


def test_a_second_usage_limit_replaces_the_first_stop(ledger: Ledger, clock: FakeClock) -> None:
    """The newest usage limit is the run's stop (what the skipped tasks say): its reset and its words."""
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    limit(ledger, LimitKind.USAGE, 3600.0, clock.now(), message="first quota")
    first = limiter.stop()
    assert first is not None and str(first).endswith(": first quota")
    limit(ledger, LimitKind.USAGE, 1800.0, clock.now(), message="second quota")
    second = limiter.stop()
    reset = reset_text(int((clock.now() + 1800.0) * 1000))
    assert second is not None and second.reason == StopReason.USAGE_LIMIT
    assert str(second) == f"{StopReason.USAGE_LIMIT} ({reset}): second quota" != str(first)
    assert limiter.width() == 4 and limiter.hold_s() == 0.0  # a usage stop neither halves nor holds
    assert fleet_rows(ledger) == [
        (4, f"{first}: starting nothing more"),
        (4, f"{second}: starting nothing more"),
    ]


def test_a_usage_limit_waited_for_holds_starts_and_stops_nothing(ledger: Ledger, clock: FakeClock) -> None:
    seen: list[object] = []
    policy = LimitPolicy(wait=True, max_wait=600.0)
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now, policy=policy, emit=seen.append)
    limit(ledger, LimitKind.USAGE, 120.0, clock.now())
    assert limiter.stop() is None
    assert limiter.hold_s() == pytest.approx(120.0, abs=0.01) and limiter.width() == 4
    ((width, message),) = fleet_rows(ledger)
    assert width == 4 and message.startswith("waiting for a usage limit's reset (resets ")
    limit(ledger, LimitKind.USAGE, None, clock.now(), message="no reset named")  # nothing to wait for
    stop = limiter.stop()
    assert stop is not None and str(stop).startswith("usage limit reached (reset unknown): no reset named")
    assert len(seen) == 2


@pytest.mark.parametrize(
    ("left", "waits"), [(600.0, True), (600.5, False), (0.0, True)], ids=["equal", "over", "now"]
)
def test_wait_for_limits_waits_a_reset_up_to_exactly_max_wait(
    ledger: Ledger, left: float, waits: bool
) -> None:
    clock = FakeClock(1_000_000.0)  # whole milliseconds: the reset is exactly `left` away
    policy = LimitPolicy(wait=True, max_wait=600.0)
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now, policy=policy)
    usage = {"reset_at_ms": int((clock.now() + left) * 1000)}
    assert limiter.wait_for_reset(usage) is waits
    assert clock.sleeps == ([pytest.approx(left, abs=0.01)] if waits else [])


def test_without_a_reset_or_without_the_policy_nothing_is_waited_for(
    ledger: Ledger, clock: FakeClock
) -> None:
    waiting = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now, policy=LimitPolicy(wait=True))
    default = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    assert not waiting.wait_for_reset({"reset_at_ms": None})
    assert not default.wait_for_reset({"reset_at_ms": int((clock.now() + 1) * 1000)})
    waiting.wait(-5.0)  # a reset already past is no wait
    assert clock.sleeps == [0.0]


@pytest.mark.parametrize(("length", "kept"), [(160, 160), (161, 160), (0, 0)])
def test_a_usage_stop_quotes_at_most_160_characters_of_what_was_said(
    ledger: Ledger, length: int, kept: int
) -> None:
    limiter = Limiter(ledger, RUN, 4)
    stop = limiter.usage_stop({"reset_at_ms": 0, "message": "m" * length})
    expected = "usage limit reached (resets 1970-01-01 00:00:00 UTC)" + (": " + "m" * kept if kept else "")
    assert (stop.reason, str(stop)) == (StopReason.USAGE_LIMIT, expected)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("rate limit exceeded, try again in 3h 20m", LimitKind.USAGE),
        ("429 too many requests: try again in 2 hours", LimitKind.USAGE),
        (f"rate limit exceeded, try again in {int(FAR_RESET_S)}s", LimitKind.RATE),  # exactly the bound
        (f"rate limit exceeded, try again in {int(FAR_RESET_S) + 1}s", LimitKind.USAGE),
        ("rate limit exceeded, try again in 20s", LimitKind.RATE),
    ],
)
def test_limit_words_with_a_far_reset_are_a_usage_limit(text: str, kind: LimitKind) -> None:
    event = from_text(text, source="claude-code", now_wall=1_000_000.0)
    assert event is not None and event.kind is kind


def test_rate_limit_words_with_a_reset_hours_away_stop_the_fleet_instead_of_halving_and_holding(
    ledger: Ledger, clock: FakeClock
) -> None:
    event = from_text(
        "API Error: rate limit reached, try again in 5h", source="claude-code", now_wall=clock.now()
    )
    assert event is not None
    ledger.limits.add(RUN, event, task_id="t")
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    stop = limiter.stop()
    assert stop is not None and stop.reason is StopReason.USAGE_LIMIT
    assert (limiter.width(), limiter.hold_s()) == (4, 0.0)
