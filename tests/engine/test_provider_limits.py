"""Real providers' limit answers (their 429 bodies and headers, their CLIs' usage-limit words) through the
engine's transport under a fleet: the reset decides near (wait) from far (a usage limit), words only
without one, and no Retry-After, however hostile, crashes the worker."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from stellafleet.core.limits import LimitEvent, LimitKind, from_text
from stellafleet.engine.errors import EngineError
from stellafleet.engine.redact import Redactor
from stellafleet.engine.transport import HttpTransport
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import ScriptedModelServer

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()

# OpenAI's answers, as its API sends them (https://platform.openai.com/docs/guides/error-codes)
OPENAI_HEADERS = {
    "x-ratelimit-limit-requests": "3",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "20s",
}
OPENAI_RPM = {
    "error": {
        "message": "Rate limit reached for gpt-4o-mini in organization org-x1y2z3 on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1. Please try again in 20s. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
OPENAI_TPM = {
    "error": {
        "message": "Rate limit reached for gpt-4o-mini in organization org-x1y2z3 on tokens per min (TPM): "
        "Limit 200000, Used 199990, Requested 120. Please try again in 32ms. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}
# Anthropic's (https://docs.anthropic.com/en/api/errors, /en/api/rate-limits)
ANTHROPIC_RATE = {
    "type": "error",
    "error": {
        "type": "rate_limit_error",
        "message": "This request would exceed the rate limit for your organization (1a2b3c) of 50,000 input "
        "tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
    },
}
ANTHROPIC_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


class Told:
    """The fleet's side of the worker's limit reports, in memory."""

    def __init__(self) -> None:
        self.events: list[LimitEvent] = []

    def limit(self, event: LimitEvent) -> None:
        self.events.append(event)

    def hold_s(self) -> float:
        return 0.0


def _post(error: dict[str, Any]) -> tuple[list[LimitEvent], FakeClock, EngineError | None]:
    """One call answered error, then ok: the limits told, the waits, and the error if the call failed."""
    clock, told = FakeClock(), Told()
    with ScriptedModelServer([{"error": error}, {"text": "ok"}]) as server:
        sent = HttpTransport(
            label="openai", url=f"{server.openai_base_url}/chat/completions", headers={}, timeout=5,
            max_retries=2, clock=clock, redact=Redactor(), wall=lambda: NOW, limits=told,
        )  # fmt: skip
        try:
            sent.post({"model": "m"})
        except EngineError as exc:
            return told.events, clock, exc
    return told.events, clock, None


@pytest.mark.parametrize(
    ("error", "wait"),
    [
        ({"status": 429, "json": OPENAI_RPM, "headers": {**OPENAI_HEADERS, "retry-after": "1"}}, 1.0),
        ({"status": 429, "json": OPENAI_RPM, "headers": OPENAI_HEADERS}, 1.0),  # backoff; told: 20 s
        ({"status": 429, "json": OPENAI_TPM}, 1.0),
        ({"status": 429, "json": ANTHROPIC_RATE, "headers": {"retry-after": "17"}}, 17.0),
        ({"status": 529, "json": ANTHROPIC_OVERLOADED}, 1.0),
    ],
)
def test_a_providers_rate_limit_is_waited_out_even_when_it_says_limit_reached(
    error: dict[str, Any], wait: float
) -> None:
    events, clock, failed = _post(error)
    assert failed is None
    assert [event.kind for event in events] == [LimitKind.RATE]
    assert clock.sleeps == [wait]


def test_openais_rate_limit_names_its_reset_from_its_words_without_a_retry_after() -> None:
    [event], _, _ = _post({"status": 429, "json": OPENAI_RPM, "headers": OPENAI_HEADERS})
    assert event.reset_at_ms == int((NOW + 20) * 1000)


def test_openais_spent_quota_is_a_usage_limit_even_with_a_near_retry_after() -> None:
    for headers in ({}, {"retry-after": "1"}):
        events, _, failed = _post({"status": 429, "json": OPENAI_QUOTA, "headers": headers})
        assert [event.kind for event in events] == [LimitKind.USAGE]
        assert failed is not None and "usage limit reached (reset" in str(failed)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_retry_after_that_is_no_finite_number_is_no_reset(value: str) -> None:
    events, clock, failed = _post({"status": 429, "body": "rate limited", "retry_after": value})
    assert failed is None and clock.sleeps == [1.0]  # the backoff, as with no Retry-After
    assert [(event.kind, event.reset_at_ms) for event in events] == [(LimitKind.RATE, None)]


@pytest.mark.parametrize("value", ["1e12", "1e308", "99999999999999999999"])
def test_a_retry_after_beyond_a_year_is_a_far_usage_limit_a_year_away(value: str) -> None:
    events, _, failed = _post({"status": 429, "body": "rate limited", "retry_after": value})
    [event] = events
    assert event.kind is LimitKind.USAGE and event.reset_at_ms == int((NOW + 366 * 86400) * 1000)
    assert failed is not None and "usage limit reached (resets 2027-12-01 12:00:00 UTC)" in str(failed)


@pytest.mark.parametrize(
    ("text", "kind", "reset_s"),
    [
        ("Claude AI usage limit reached|1796047200", LimitKind.USAGE, 1796047200 - NOW),
        ("Claude AI usage limit reached|1796040060", LimitKind.RATE, 60.0),  # a minute off: waited out
        ("You've hit your limit · resets 3pm (Europe/London)", LimitKind.USAGE, None),
        ("5-hour limit reached ∙ resets 3pm", LimitKind.USAGE, None),
        (
            "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing), or try again "
            "in 4 days 2 hours 5 minutes.",
            LimitKind.USAGE,
            4 * 86400 + 2 * 3600 + 5 * 60.0,
        ),
        (
            "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing), or wait for "
            "limits to reset (every 5h and every week.).",
            LimitKind.USAGE,
            None,
        ),
        ("exceeded retry limit, last status: 429 Too Many Requests", LimitKind.RATE, None),
        (
            "stream error: Rate limit reached for gpt-5 on tokens per min. Please try again in 1.5s.",
            LimitKind.RATE,
            1.5,
        ),
    ],
)
def test_the_agent_clis_real_limit_words(text: str, kind: LimitKind, reset_s: float | None) -> None:
    event = from_text(text, source="claude-code", now_wall=NOW)
    assert event is not None and event.kind is kind
    expected = None if reset_s is None else int((NOW + reset_s) * 1000)
    assert event.reset_at_ms == expected
