"""run/limiter.py: the fleet's width and hold under the limits its workers write to the ledger, and
PlanRunner starting only as many as it allows, in waves and eagerly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stellafleet.core.limits import LimitEvent, LimitKind
from stellafleet.core.status import StopReason
from stellafleet.plan.model import PlanTask, plan_from_data
from stellafleet.run.limiter import Limiter, LimitPolicy
from stellafleet.run.waves import PlanRunner
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.sample_ledger import add_run

RUN = "r-limits"


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    opened = Ledger.open(tmp_path / "fleet.db")
    add_run(opened, RUN, base_ref="HEAD", base_commit="c0" * 20, max_concurrency=4, pipeline="plain", argv=[])
    yield opened
    opened.close()


def rate(ledger: Ledger, reset_in: float, now: float, task: str = "x") -> None:
    event = LimitEvent(LimitKind.RATE, "engine", 429, int((now + reset_in) * 1000), "rate limited")
    ledger.limits.add(RUN, event, task_id=task)


def test_a_rate_limit_halves_the_width_and_holds_starts_until_its_reset(ledger: Ledger) -> None:
    clock = FakeClock(time.time())
    limiter = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    assert (limiter.width(), limiter.hold_s()) == (4, 0.0)
    rate(ledger, 2.0, clock.now())
    assert limiter.width() == 2 and limiter.hold_s() == pytest.approx(2.0, abs=0.01)
    clock.advance(2.0)
    assert limiter.hold_s() == 0.0
    rows = ledger.limits.of_run(RUN)
    assert [(row["kind"], row["concurrency"]) for row in rows] == [("rate", None), ("concurrency", 2)]
    assert rows[1]["message"].startswith("halved to 2 (was 4) after a rate limit in task x")


def test_a_far_usage_limit_stops_unless_waiting_for_it_is_allowed(ledger: Ledger) -> None:
    clock = FakeClock(time.time())
    stopping = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now)
    waiting = Limiter(ledger, RUN, 4, clock=clock, wall=clock.now, policy=LimitPolicy(wait=True, max_wait=10))
    far = LimitEvent(LimitKind.USAGE, "engine", 429, int((clock.now() + 7200) * 1000), "usage limit")
    ledger.limits.add(RUN, far, task_id="a")
    stop = stopping.stop()
    assert stop is not None and stop.reason is StopReason.USAGE_LIMIT
    assert str(stop).startswith("usage limit reached (resets ") and "usage limit" in str(stop)
    assert waiting.stop() is not None  # 2 hours is more than its 10 s maximum wait
    near = {"reset_at_ms": int((clock.now() + 3) * 1000), "message": "usage limit"}
    assert waiting.wait_for_reset(near) and clock.sleeps[-1] == pytest.approx(3.0, abs=0.01)
    assert not stopping.wait_for_reset(near)


class Gate:
    """A stand-in for the Limiter (its arithmetic is tested above): a width, and a hold of `hold` seconds
    at the first look that the runner must wait out through wait()."""

    def __init__(self, width: int, hold: float = 0.0) -> None:
        self.value = width
        self.hold = hold
        self.waits: list[float] = []

    def width(self) -> int:
        return self.value

    def hold_s(self) -> float:
        return self.hold

    def stop(self) -> None:
        return None

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.hold = 0.0


@pytest.mark.parametrize("schedule", ["waves", "eager"])
def test_plan_runner_runs_no_more_at_once_than_the_gate_allows(schedule: str) -> None:
    plan = plan_from_data({"tasks": [{"id": i, "prompt": f"do {i}"} for i in "abcdef"]})
    gate, lock = Gate(2, hold=5.0), threading.Lock()
    running: set[str] = set()
    most = 0

    def execute(task: PlanTask) -> bool:
        nonlocal most
        with lock:
            running.add(task.id)
            most = max(most, len(running))
        time.sleep(0.05)
        with lock:
            running.discard(task.id)
            if task.id == "c":
                gate.value = 4  # grown back: what starts from now on may run four at once
        return True

    runner = PlanRunner(plan, 4, execute, schedule=schedule, gate=gate)
    seen = runner.run()
    assert set(seen.statuses.values()) == {"succeeded"}
    assert gate.waits == [5.0]  # nothing ran: the runner itself waited the hold out before the first start
    started = [task for wave in runner.waves for task in wave]
    assert started == list("abcdef")
    if schedule == "waves":
        assert runner.waves == [["a", "b"], ["c", "d"], ["e", "f"]]
        assert most == 2
    else:
        assert 2 <= most <= 3  # two until c ended, then e and f beside d
