"""The run's spend limit, handed out as the workers' guards so the run's total never passes it.

Each worker starts with a guard of min(limit / concurrency, what is left of the limit): what is left is
the limit less what ended attempts spent and less the guards of the workers still running (their spend
is bounded by their guard, so their whole guard is held until they end; then what they really spent
counts instead). A task whose guard would be under the configured minimum (`[governor] min_guard_usd`)
is not started. As long as every worker stops at its guard, the run's total stays within the limit.
"""

from __future__ import annotations

import threading

from stellafleet.core.spend import money

SPEND_STOP_PREFIX = "spend limit reached"


def spend_stop_text(spent: float, limit: float) -> str:
    """The one line that says the run's spend has reached its limit: `spend limit reached: $X of $Y`."""
    return f"{SPEND_STOP_PREFIX}: {money(spent)} of {money(limit)}"


class NoBudget(Exception):
    """No guard of at least the minimum is left for another worker; the message is the reason shown."""


class SpendBudget:
    """Guards for the workers of one run; thread-safe (one dispatch thread per task)."""

    def __init__(self, limit: float, concurrency: int, *, min_guard: float, spent: float = 0.0) -> None:
        self.limit = limit
        self.per_worker = limit / max(1, concurrency)
        self.min_guard = min_guard
        self._spent = spent  # by attempts that ended
        self._held: dict[str, float] = {}  # task id -> the guard of its running worker
        self._lock = threading.Lock()

    def _left(self) -> float:
        return self.limit - self._spent - sum(self._held.values())

    def exhausted(self) -> str | None:
        """Why no further worker can start (None: one can)."""
        with self._lock:
            return self._why_not(min(self.per_worker, self._left()))

    def _why_not(self, guard: float) -> str | None:
        if guard >= self.min_guard and guard > 0:
            return None
        used = self.limit - max(0.0, self._left())
        return (
            f"{SPEND_STOP_PREFIX}: {money(used)} of {money(self.limit)} spent or held by running workers, "
            f"less than the {money(self.min_guard)} minimum guard left"
        )

    def reserve(self, task_id: str) -> float:
        """The guard for task_id's worker, held until release(); NoBudget when too little is left."""
        with self._lock:
            guard = min(self.per_worker, self._left())
            reason = self._why_not(guard)
            if reason is not None:
                raise NoBudget(reason)
            self._held[task_id] = guard
            return guard

    def release(self, task_id: str, spent: float) -> None:
        """task_id's worker ended having spent this much: its guard is no longer held."""
        with self._lock:
            if self._held.pop(task_id, None) is not None:
                self._spent += spent
