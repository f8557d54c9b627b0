"""The fleet's side of provider limits: how many tasks may start now, and when (docs/fleet.md), from the
limit_events workers wrote before each start; running workers are never stopped for a limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.limits import LimitEvent, LimitKind, Width, reset_text
from stellafleet.core.status import Stop, StopReason
from stellafleet.run.events import Emit, Notice
from stellafleet.state.ledger import Ledger


@dataclass(frozen=True)
class LimitPolicy:
    """What a run does on a usage limit: wait for its reset (up to max_wait seconds) or stop."""

    wait: bool = False
    max_wait: float = 21600.0


class Limiter:
    """A run's width and hold under provider limits; thread-safe (dispatch threads and the runner)."""

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        ceiling: int,
        *,
        policy: LimitPolicy = LimitPolicy(),
        emit: Emit | None = None,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ledger, self.run_id, self.policy = ledger, run_id, policy
        self.width_now = Width(ceiling)
        self.emit: Emit = emit or (lambda event: None)
        self.clock = clock or SystemClock()
        self.wall = wall
        self._seen = 0  # the last limit_events row read
        self._hold_until_ms = 0
        self._stop: Stop | None = None
        self._lock = threading.RLock()

    def width(self) -> int:
        """How many tasks may run at once now."""
        self.poll()
        return self.width_now.value

    def hold_s(self) -> float:
        """Seconds until new tasks may start (0: now)."""
        self.poll()
        with self._lock:
            return max(0.0, self._hold_until_ms / 1000 - self.wall())

    def stop(self) -> Stop | None:
        """The usage limit that stops the run (None: none)."""
        self.poll()
        return self._stop

    def wait(self, seconds: float) -> None:
        """Wait (through the clock) while starts are held."""
        self.clock.sleep(max(0.0, seconds))

    def attempt_ended(self, attempt_id: int) -> list[dict[str, Any]]:
        """An attempt ended: without a limit the width grows by one. The limit rows it wrote."""
        self.poll()
        rows = self.ledger.limits.of_attempt(attempt_id)
        if not rows:
            with self._lock:
                before = self.width_now.value
                after = self.width_now.grow()
            if after != before:
                self._record(f"grew to {after} after a task ended without a limit", after)
        return rows

    def wait_out_hold(self) -> None:
        """Wait until new starts are no longer held (a rate limit's reset)."""
        hold = self.hold_s()
        if hold > 0:
            self.wait(hold)

    def wait_for_reset(self, usage: dict[str, Any]) -> bool:
        """Under --wait-for-limits, wait until a usage limit's reset (True: waited, run it again);
        False: the run stops for it instead."""
        left = self._waitable(usage.get("reset_at_ms"))
        if left is None:
            return False
        self.wait(left)
        return True

    def _waitable(self, reset_ms: int | None) -> float | None:
        """Seconds left to a usage limit's reset, when --wait-for-limits waits that long; else None."""
        left = None if reset_ms is None else reset_ms / 1000 - self.wall()
        if not self.policy.wait or left is None or left > self.policy.max_wait:
            return None
        return left

    def usage_stop(self, usage: dict[str, Any]) -> Stop:
        """The stop a usage limit makes: `usage limit reached (resets ... UTC): <what was said>`."""
        text = f"{StopReason.USAGE_LIMIT} ({reset_text(usage.get('reset_at_ms'))})"
        if usage.get("message"):
            text += f": {usage['message'][:160]}"
        return Stop(StopReason.USAGE_LIMIT, text)

    def poll(self) -> None:
        """Take in the limit rows workers wrote since the last look."""
        with self._lock:
            rows = self.ledger.limits.after(self.run_id, self._seen)
            for row in rows:
                self._seen = max(self._seen, int(row["id"]))
                self._take(row)

    def _take(self, row: dict[str, Any]) -> None:
        reset = row.get("reset_at_ms")
        task = row.get("task_id") or "?"
        if row["kind"] == LimitKind.USAGE:
            self._usage(row, reset)
            return
        before, after = self.width_now.value, self.width_now.lower()
        if reset is not None:
            # the provider's newest answer is the truth: a nearer reset shortens the hold, a further one
            # lengthens it; a limit that names no reset leaves the hold as it was
            self._hold_until_ms = int(reset)
        change = f"halved to {after} (was {before})" if after != before else f"kept at {after}"
        why = f"{change} after a rate limit in task {task} ({reset_text(reset)})"
        self._record(why, after)

    def _usage(self, row: dict[str, Any], reset: int | None) -> None:
        if reset is not None and self._waitable(reset) is not None:
            self._hold_until_ms = int(reset)
            self._record(f"waiting for a usage limit's reset ({reset_text(reset)})", self.width_now.value)
        else:  # a later usage limit replaces the earlier stop: its reset and words are the newest
            self._stop = self.usage_stop(row)
            self._record(f"{self._stop}: starting nothing more", self.width_now.value)

    def _record(self, why: str, width: int) -> None:
        event = LimitEvent(LimitKind.CONCURRENCY, "fleet", message=why)
        self.ledger.limits.add(self.run_id, event, concurrency=width)
        self.emit(Notice(f"provider limits: {why}"))
