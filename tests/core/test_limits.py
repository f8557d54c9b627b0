"""core/limits.py: what a limit is, how one is recognised in an answer or a CLI's words, and the width."""

from __future__ import annotations

import pytest

from stellafleet.core.limits import LimitKind, Width, from_http, from_text, kind_of, reset_in_text

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "wait", "text", "kind"),
    [
        (429, 1.0, "rate limited", LimitKind.RATE),
        (529, None, '{"type": "overloaded_error"}', LimitKind.RATE),
        (503, None, "the model is overloaded", LimitKind.RATE),
        (503, None, "service unavailable", None),
        (500, None, "internal error", None),
        (429, 7200.0, "slow down", LimitKind.USAGE),  # a reset hours away is a usage limit
        (429, None, "You've hit your usage limit. Try again in 2h 0m 0s.", LimitKind.USAGE),
        (429, None, '{"code": "insufficient_quota"}', LimitKind.USAGE),
        (None, None, "exceeded retry limit, last status: 429 Too Many Requests", LimitKind.RATE),
        (None, None, "the tests failed: 3 errors", None),
    ],
)
def test_kind_of_an_answer(status: int | None, wait: float | None, text: str, kind: LimitKind | None) -> None:
    assert kind_of(status, wait, text) is kind


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("Try again in 2h 0m 0s.", 7200.0),
        ("try again in 5 minutes", 300.0),
        ("resets in 30s", 30.0),
        ("Claude AI usage limit reached|1800003600", 3600.0),
        ("no reset named here", None),
        ("You’ve hit your usage limit. Try again at Jan 15th, 2027 9:00 AM.", 3600.0),  # local time
    ],
)
def test_the_reset_a_message_names(text: str, seconds: float | None) -> None:
    assert reset_in_text(text, NOW) == seconds


def test_a_reset_codex_names_as_a_local_time() -> None:
    from datetime import datetime

    text = "You’ve hit your usage limit. Try again at Jan 15th, 2027 12:10 PM."
    expected = datetime(2027, 1, 15, 12, 10).timestamp() - NOW
    assert reset_in_text(text, NOW) == pytest.approx(expected)
    assert reset_in_text("Try again at Jan 16th, 2027 12:10 AM.", NOW) == pytest.approx(expected + 12 * 3600)


def test_a_reset_later_the_same_day_codex_names_by_its_time_alone() -> None:
    """Codex leaves the date out when the reset is today: "Try again at 2:02 AM." is the next 2:02 AM."""
    from datetime import datetime, timedelta

    local = datetime.fromtimestamp(NOW).replace(second=0, microsecond=0)
    ahead, behind = local + timedelta(hours=2), local - timedelta(hours=1)
    lead = NOW - local.timestamp()  # NOW's seconds past its whole minute

    def said(when: datetime) -> str:
        return f"You’ve hit your usage limit. Try again at {when.strftime('%I:%M %p').lstrip('0')}."

    assert reset_in_text(said(ahead), NOW) == pytest.approx(7200 - lead)
    assert reset_in_text(said(behind), NOW) == pytest.approx(23 * 3600 - lead)  # past today: tomorrow's
    assert reset_in_text(f"Try again at {ahead.strftime('%H:%M')}", NOW) == pytest.approx(7200 - lead)


def test_an_http_limit_carries_its_reset_and_a_cli_one_its_words() -> None:
    event = from_http(429, 2.5, "rate limited", now_wall=NOW)
    assert event is not None and event.kind is LimitKind.RATE and event.source == "engine"
    assert event.reset_at_ms == int((NOW + 2.5) * 1000) and event.status == 429
    assert from_http(404, None, "not found", now_wall=NOW) is None
    usage = from_text("You've hit your usage limit. Try again in 2h 0m 0s.", source="codex", now_wall=NOW)
    assert usage is not None and usage.kind is LimitKind.USAGE and usage.source == "codex"
    assert usage.reset_at_ms == int((NOW + 7200) * 1000)
    assert usage.reset_text().startswith("resets 2027-01-15 ") and usage.reset_text().endswith(" UTC")


def test_the_width_halves_on_a_limit_grows_by_one_and_stays_within_its_bounds() -> None:
    width = Width(8)
    assert [width.lower(), width.lower(), width.lower(), width.lower()] == [4, 2, 1, 1]
    assert [width.grow() for _ in range(9)] == [2, 3, 4, 5, 6, 7, 8, 8, 8]
    assert Width(0).value == 1
