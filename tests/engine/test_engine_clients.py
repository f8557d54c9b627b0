"""Model clients and engine settings: retries, Retry-After, URLs, keys, config problems."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.engine.anthropic import _anthropic_url
from stellafleet.engine.clients import make_client
from stellafleet.engine.errors import EngineError
from stellafleet.engine.messages import UserText
from stellafleet.engine.openai import _openai_url
from stellafleet.engine.redact import Redactor
from stellafleet.engine.settings import is_loopback, load_settings, settings_problems
from stellafleet.engine.transport import HttpTransport, retry_after_seconds
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import ScriptedModelServer

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()


def test_retry_after_as_seconds_or_http_date() -> None:
    assert retry_after_seconds("7", NOW) == 7.0
    assert retry_after_seconds("1.5", NOW) == 1.5
    later = format_datetime(datetime(2026, 11, 30, 12, 0, 42, tzinfo=UTC), usegmt=True)
    assert retry_after_seconds(later, NOW) == 42.0
    assert retry_after_seconds("Mon, 30 Nov 2026 11:00:00 GMT", NOW) == 0.0  # in the past: at once
    assert retry_after_seconds("soon", NOW) is None
    assert retry_after_seconds(None, NOW) is None


def transport(server: ScriptedModelServer, clock: FakeClock, **kwargs: object) -> HttpTransport:
    return HttpTransport(
        label="openai",
        url=f"{server.openai_base_url}/chat/completions",
        headers={},
        timeout=5,
        max_retries=kwargs.pop("max_retries", 3),  # type: ignore[arg-type]
        clock=clock,
        redact=Redactor(),
        wall=lambda: NOW,
        **kwargs,  # type: ignore[arg-type]
    )


def test_http_date_retry_after_is_slept_through_the_clock() -> None:
    later = format_datetime(datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC), usegmt=True)
    steps = [{"error": {"status": 503, "retry_after": later}}, {"text": "ok"}]
    clock = FakeClock()
    with ScriptedModelServer(steps) as server:
        data = transport(server, clock).post({"model": "m"})
    assert data["choices"][0]["message"]["content"] == "ok"
    assert clock.sleeps == [30.0]


def test_backoff_doubles_and_a_huge_retry_after_is_capped() -> None:
    steps = [
        {"error": {"status": 500}},
        {"error": {"status": 502}},
        {"error": {"status": 429, "retry_after": "86400"}},
        {"text": "ok"},
    ]
    clock = FakeClock()
    with ScriptedModelServer(steps) as server:
        transport(server, clock, max_retry_after=120.0).post({})
    assert clock.sleeps == [1.0, 2.0, 120.0]


def test_client_errors_are_not_retried() -> None:
    clock = FakeClock()
    with ScriptedModelServer(
        [{"error": {"status": 400, "body": "bad request: no such model"}}, {"text": "never"}]
    ) as server:
        with pytest.raises(EngineError) as raised:
            transport(server, clock).post({})
        assert len(server.requests) == 1
    assert raised.value.status == 400 and "no such model" in str(raised.value) and clock.sleeps == []
    assert raised.value.exit_code == 1 and isinstance(raised.value, StellaError)


def test_connection_refused_fails_cleanly_after_retries() -> None:
    server = ScriptedModelServer([])
    url = server.openai_base_url
    server._httpd.server_close()  # nothing listens on that port any more
    settings = load_settings(Config({"engine": {"model": "m", "base_url": url, "max_retries": 2}}), env={})
    clock = FakeClock()
    client = make_client(settings, clock=clock, env={})
    with pytest.raises(EngineError, match=r"ConnectError.*after 3 attempts"):
        client.complete("s", [UserText("hi")], [], 10)
    assert clock.sleeps == [1.0, 2.0]


def test_base_urls() -> None:
    assert _openai_url("http://localhost:11434") == "http://localhost:11434/v1/chat/completions"
    assert _openai_url("http://localhost:11434/v1/") == "http://localhost:11434/v1/chat/completions"
    assert _openai_url("https://openrouter.ai/api/v1") == "https://openrouter.ai/api/v1/chat/completions"
    assert _anthropic_url("https://api.anthropic.com") == "https://api.anthropic.com/v1/messages"
    assert _anthropic_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1/messages"
    assert (
        is_loopback("http://localhost:8080/v1")
        and is_loopback("http://127.0.0.1:1")
        and is_loopback("http://[::1]:8/")
    )
    assert not is_loopback("https://api.openai.com/v1")


def test_settings_defaults_and_provider_inference() -> None:
    s = load_settings(Config({"engine": {"model": "claude-sonnet-4-5"}}), env={"ANTHROPIC_API_KEY": "k" * 20})
    assert (s.provider, s.base_url, s.api_key_env) == (
        "anthropic",
        "https://api.anthropic.com",
        "ANTHROPIC_API_KEY",
    )
    assert (s.max_steps, s.max_output_tokens, s.shell) == (100, 4096, False)
    s = load_settings(
        Config({"engine": {"model": "llama3", "base_url": "http://localhost:11434/v1"}}), env={}
    )
    assert s.provider == "openai" and is_loopback(s.base_url) and s.api_key({}) is None
    s = load_settings(
        Config({"engine": {"model": "m", "base_url": "https://llm.example.com/v1", "api_key_env": ""}}),
        env={},
    )
    assert s.api_key({"OPENAI_API_KEY": "x" * 20}) is None  # "" means: send no key


def test_settings_problems_are_listed_together() -> None:
    config = Config(
        {"engine": {"provider": "gemini", "max_steps": 0, "shell": "yes", "request_timeout": "long"}}
    )
    problems = settings_problems(config, env={})
    text = "\n".join(problems)
    assert "no model configured" in text and "engine.provider must be one of openai, anthropic" in text
    assert "engine.max_steps must be a whole number >= 1" in text
    assert "engine.shell must be true or false" in text
    assert "engine.request_timeout" in text
    with pytest.raises(StellaError) as raised:
        load_settings(config, env={})
    assert raised.value.exit_code == 2
    remote = Config({"engine": {"model": "gpt-4o", "api_key_env": "MY_KEY"}})
    assert settings_problems(remote, env={}) == [
        "no API key for openai: set MY_KEY in the environment "
        '(or name another variable with `api_key_env = "..."` under [engine])'
    ]
    assert settings_problems(remote, env={"MY_KEY": "sk-1234567890abcdef"}) == []


def test_model_override_wins() -> None:
    config = Config({"engine": {"model": "a", "base_url": "http://127.0.0.1:1/v1"}})
    assert load_settings(config, model="b", env={}).model == "b"


class Told:
    """A fleet's limit reporter, in memory: the limits told, and a hold to wait out before each call."""

    def __init__(self, hold: float = 0.0) -> None:
        self.events: list = []
        self.hold = hold

    def limit(self, event) -> None:  # type: ignore[no-untyped-def]
        self.events.append(event)

    def hold_s(self) -> float:
        hold, self.hold = self.hold, 0.0
        return hold


def test_under_a_fleet_limits_are_told_the_hold_is_waited_out_and_a_usage_limit_is_not_retried() -> None:
    from stellafleet.core.limits import LimitKind

    steps = [
        {"error": {"status": 429, "retry_after": "2"}},
        {"text": "ok"},
        {"error": {"status": 429, "body": "You've hit your usage limit. Try again in 2h 0m 0s."}},
        {"text": "never"},
    ]
    clock, told = FakeClock(), Told(hold=1.5)
    with ScriptedModelServer(steps) as server:
        sent = transport(server, clock)
        sent.limits = told
        sent.post({})
        with pytest.raises(EngineError) as raised:
            sent.post({})
        assert len(server.requests) == 3
    assert clock.sleeps == [1.5, 2.0]  # the fleet's hold, then the Retry-After
    assert [event.kind for event in told.events] == [LimitKind.RATE, LimitKind.USAGE]
    assert told.events[0].status == 429 and told.events[0].reset_at_ms is not None
    assert "usage limit reached (resets " in str(raised.value)
