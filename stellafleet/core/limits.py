"""Provider limits: what a limit event is, how one is recognised, and the fleet's width under them."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

# A rate limit whose reset is further away than this is a usage limit: not worth waiting in a worker.
FAR_RESET_S = 300.0
LIMIT_STATUSES = frozenset({429, 529})
_USAGE_WORDS = re.compile(r"usage limit|quota|insufficient_quota|billing|limit reached|hit your limit", re.I)
_RATE_WORDS = re.compile(r"rate.?limit|overloaded|too many requests|\b429\b|\b529\b", re.I)
# A spent quota or an unpaid bill: no wait ends it, whatever reset the answer names.
_QUOTA_WORDS = re.compile(r"insufficient_quota|exceeded your current quota|billing", re.I)
# A reset is clamped to a year: still a far usage limit, and a date datetime can print.
MAX_RESET_S = 366 * 86400.0
_RESET_IN = re.compile(
    r"(?:try again|resets?|retry)\s+(?:in|after)\s+((?:\d+(?:\.\d+)?\s*"
    r"(?:ms|milliseconds?|d(?:ays?)?|h(?:ours?|rs?)?|m(?:in(?:ute)?s?)?|s(?:ec(?:ond)?s?)?)(?![a-z])[\s,]*)+)",
    re.I,
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)", re.I)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_RESET_AT = re.compile(
    r"try again at (\w{3})\w* (\d{1,2})(?:st|nd|rd|th)?,? (\d{4}),? (\d{1,2}):(\d{2})\s*([AP]M)?", re.I
)
_RESET_AT_TIME = re.compile(r"try again at (\d{1,2}):(\d{2})\s*([AP]M)?\b", re.I)
_RESET_EPOCH = re.compile(r"(?:limit reached|reset(?:s|_at)?)\W{0,3}(\d{10})\b", re.I)


class LimitKind(StrEnum):
    RATE = "rate"  # come back in seconds
    USAGE = "usage"  # a quota with a far reset
    CONCURRENCY = "concurrency"  # the fleet's own row: its width changed


@dataclass(frozen=True)
class LimitEvent:
    """One limit a worker met: its kind, where it came from, when it resets (epoch ms), what was said."""

    kind: LimitKind
    source: str  # engine | claude-code | codex | aider | fleet
    status: int | None = None
    reset_at_ms: int | None = None
    message: str = ""

    def reset_text(self) -> str:
        """The reset for people: `resets 14:05:00 UTC` (`reset unknown` without one)."""
        return reset_text(self.reset_at_ms)


class LimitReporter(Protocol):
    """Where a worker's limit events go (the worker's: the ledger), and the fleet-wide hold."""

    def limit(self, event: LimitEvent) -> None: ...

    def hold_s(self) -> float:
        """Seconds until the latest rate-limit reset any worker of the run reported (0: none ahead)."""
        ...


def limits_of(spend: object) -> LimitReporter | None:
    """The limit reporter a pipeline's spend reporter carries, if any."""
    found = getattr(spend, "limits", None)
    return found if found is not None and hasattr(found, "limit") else None


def reset_text(reset_at_ms: int | None) -> str:
    if reset_at_ms is None:
        return "reset unknown"
    when = datetime.fromtimestamp(reset_at_ms / 1000, UTC)
    return f"resets {when:%Y-%m-%d %H:%M:%S} UTC"


def kind_of(status: int | None, reset_s: float | None, text: str) -> LimitKind | None:
    """The limit an answer means (None: no limit). A reset it names decides: near is a rate limit, far
    a usage limit (OpenAI's rate limits say "limit reached"); the words decide only without one."""
    usage_words = bool(_USAGE_WORDS.search(text)) and (status in LIMIT_STATUSES or status is None)
    rate = status in LIMIT_STATUSES or (status in (None, 503) and bool(_RATE_WORDS.search(text)))
    if not (usage_words or rate):
        return None
    if usage_words and _QUOTA_WORDS.search(text):
        return LimitKind.USAGE
    if reset_s is not None:
        return LimitKind.USAGE if reset_s > FAR_RESET_S else LimitKind.RATE
    return LimitKind.USAGE if usage_words else LimitKind.RATE


def _event(
    status: int | None, seconds: float | None, text: str, source: str, now: float
) -> LimitEvent | None:
    """The limit event of an answer whose reset is seconds away (None: it names none); a reset that is
    not a finite number is none, one past a year is a year away."""
    if seconds is not None and not math.isfinite(seconds):
        seconds = None
    seconds = None if seconds is None else min(max(seconds, 0.0), MAX_RESET_S)
    kind = kind_of(status, seconds, text)
    if kind is None:
        return None
    reset = None if seconds is None else int((now + seconds) * 1000)
    return LimitEvent(kind, source, status, reset, " ".join(text.split())[:300])


def from_http(
    status: int | None,
    retry_after_s: float | None,
    text: str,
    *,
    source: str = "engine",
    now_wall: float | None = None,
) -> LimitEvent | None:
    """The limit event an HTTP answer (or a CLI's report of one) is (None: not a limit): its reset from
    Retry-After, else from its words."""
    now = time.time() if now_wall is None else now_wall
    seconds = retry_after_s if retry_after_s is not None else reset_in_text(text, now)
    return _event(status, seconds, text, source, now)


def reset_in_text(text: str, now_wall: float | None = None) -> float | None:
    """Seconds to the reset a CLI's message names (`try again in 2h 5m`, ...); None when it names none."""
    now = time.time() if now_wall is None else now_wall
    epoch = _RESET_EPOCH.search(text)
    if epoch:
        return max(0.0, float(epoch.group(1)) - now)
    at = _RESET_AT.search(text)
    if at:
        month, day, year, hour, minute, half = at.groups()
        try:
            when = datetime.strptime(
                f"{month[:3]} {day} {year} {_hour_24(hour, half)}:{minute}", "%b %d %Y %H:%M"
            )
        except ValueError:
            return None
        return max(0.0, when.timestamp() - now)  # naive: the local time the CLI wrote it in
    at_time = _RESET_AT_TIME.search(text)
    if at_time:
        hour, minute, half = at_time.groups()
        try:
            when = datetime.fromtimestamp(now).replace(
                hour=_hour_24(hour, half), minute=int(minute), second=0, microsecond=0
            )
        except ValueError:
            return None
        ahead = when.timestamp() - now
        return ahead if ahead >= 0 else ahead + 86400.0  # a time already past today is tomorrow's
    match = _RESET_IN.search(text)
    if match is None:
        return None
    parts = _DURATION_PART.findall(match.group(1))  # `2h 0m 0s`, `20s`, `32ms`, `4 days 2 hours`
    return sum(float(number) * _unit_s(unit.lower()) for number, unit in parts)


def _unit_s(unit: str) -> float:
    return 0.001 if unit == "ms" or unit.startswith("milli") else _UNIT_S[unit[0]]


def _hour_24(hour: str, half: str | None) -> int:
    if not half:
        return int(hour)
    return int(hour) % 12 + (12 if half.upper() == "PM" else 0)


def from_text(text: str, *, source: str, now_wall: float | None = None) -> LimitEvent | None:
    """The limit event an agent CLI's message tells of (None: it tells of none)."""
    now = time.time() if now_wall is None else now_wall
    return _event(None, reset_in_text(text, now), text, source, now)


class Width:
    """How many tasks a run starts at once under provider limits. Not thread-safe (run/limiter.py locks)."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.value = self.ceiling

    def lower(self) -> int:
        self.value = max(1, self.value // 2)
        return self.value

    def grow(self) -> int:
        self.value = min(self.ceiling, self.value + 1)
        return self.value
