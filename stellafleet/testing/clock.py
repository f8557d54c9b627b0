"""A Clock for tests: time that moves only when a test (or a sleep) moves it."""

from __future__ import annotations

import threading


class FakeClock:
    """A clock whose sleep advances time at once; thread-safe."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._now += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)
