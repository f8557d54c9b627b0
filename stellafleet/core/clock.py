"""Time as a boundary, so tests can move it without sleeping (stellafleet/testing/clock.py)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic within one process."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch, as the ledger stores times."""
    return int(time.time() * 1000)
