"""The HTTP under every model client: POST JSON, retry 429, 5xx and connection errors, report limits."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

import httpx

from stellafleet.core.clock import Clock
from stellafleet.core.limits import LimitKind, LimitReporter, from_http
from stellafleet.core.terminal import one_line
from stellafleet.engine.errors import EngineError
from stellafleet.engine.messages import ModelReply
from stellafleet.engine.redact import Redactor
from stellafleet.engine.settings import EngineSettings

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
BACKOFF_BASE_S = 1.0  # doubled after each failed attempt, up to BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0


def retry_after_seconds(value: str | None, now_wall: float) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP date; None when absent, garbled or
    not a finite number (`nan`, `inf`)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now_wall, 0.0)


EXCERPT = 200  # characters of a response body an error quotes


@dataclass(kw_only=True)
class HttpTransport:
    label: str
    url: str
    headers: InitVar[Mapping[str, str]]
    timeout: InitVar[float]
    max_retries: int
    clock: Clock
    redact: Redactor
    wall: Callable[[], float] = time.time
    max_retry_after: float = 300.0
    limits: LimitReporter | None = None
    http: httpx.Client = field(init=False)

    def __post_init__(self, headers: Mapping[str, str], timeout: float) -> None:
        self.http = httpx.Client(headers=dict(headers), timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def fail(self, message: str, status: int | None = None) -> EngineError:
        return EngineError(
            self.redact(f"{self.label} request to {self.url} failed: {message}"), status=status
        )

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            self._hold()
            try:
                response = self.http.post(self.url, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts:
                    raise self.fail(f"{problem} (after {attempts} attempts)") from None
            else:
                if response.status_code < 300:
                    return self._json_object(response)
                status = response.status_code
                detail = f"HTTP {status}: {one_line(response.text, EXCERPT)}"
                if status not in RETRY_STATUSES:
                    if status in (401, 403):
                        detail += " (check the API key and engine.api_key_env)"
                    raise self.fail(detail, status)
                if attempt == attempts:
                    raise self.fail(f"{detail} (after {attempts} attempts)", status)
                wait = self._asked_wait(response)
                self._report_limit(status, wait, response.text, detail)
            if wait is None:
                wait = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
            self.clock.sleep(min(wait, self.max_retry_after))
        raise AssertionError("unreachable")

    def _hold(self) -> None:
        """Wait out the latest rate-limit reset another worker of the run was told, before calling."""
        if self.limits is not None:
            hold = self.limits.hold_s()
            if hold > 0:
                self.clock.sleep(min(hold, self.max_retry_after))

    def _report_limit(self, status: int, wait: float | None, text: str, detail: str) -> None:
        """Tell the fleet of a limit; under a fleet a usage limit ends the call (EngineError)."""
        event = from_http(status, wait, text, now_wall=self.wall()) if self.limits is not None else None
        if event is None or self.limits is None:
            return
        self.limits.limit(event)
        if event.kind is LimitKind.USAGE:
            raise self.fail(f"usage limit reached ({event.reset_text()}): {detail}", status)

    def _json_object(self, response: httpx.Response) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            raise self.fail(f"response is not JSON: {one_line(response.text, EXCERPT)}") from None
        if not isinstance(data, dict):
            raise self.fail(f"response is not a JSON object: {one_line(response.text, EXCERPT)}")
        return data

    def _asked_wait(self, response: httpx.Response) -> float | None:
        """The wait the server asked for (Retry-After, else Retry-After-Ms), or None."""
        wait = retry_after_seconds(response.headers.get("retry-after"), self.wall())
        if wait is None and response.headers.get("retry-after-ms"):
            wait = retry_after_seconds(response.headers["retry-after-ms"], 0.0)
            wait = None if wait is None else wait / 1000
        return wait


class WireClient:
    """What both providers' clients share: the settings and one transport; a subclass is one wire format."""

    label: ClassVar[str]

    def __init__(
        self,
        settings: EngineSettings,
        api_key: str | None,
        *,
        clock: Clock,
        redact: Redactor,
        limits: LimitReporter | None = None,
    ) -> None:
        self.settings = settings
        self.transport = HttpTransport(
            label=self.label,
            url=self.endpoint(settings.base_url),
            headers={"content-type": "application/json", **self.headers(api_key)},
            timeout=settings.request_timeout,
            max_retries=settings.max_retries,
            clock=clock,
            redact=redact,
            limits=limits,
        )

    @staticmethod
    def endpoint(base_url: str) -> str:
        raise NotImplementedError

    @staticmethod
    def headers(api_key: str | None) -> dict[str, str]:
        raise NotImplementedError

    def send(self, body: dict[str, Any], reply: Callable[[dict[str, Any]], ModelReply]) -> ModelReply:
        """POST body and read the answer with reply, whose KeyError, TypeError, ... mean it is not in the
        provider's shape."""
        data = self.transport.post(body)
        try:
            return reply(data)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise self.transport.fail(
                f"unexpected response shape ({exc!r}): {one_line(json.dumps(data), EXCERPT)}"
            ) from None

    def close(self) -> None:
        self.transport.close()


def arguments_text(value: Any) -> str:
    """Tool arguments as JSON text; some servers send an object, some a string (maybe malformed)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def token_count(value: Any) -> int:
    """A usage number from a reply; 0 when absent or not a number."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
