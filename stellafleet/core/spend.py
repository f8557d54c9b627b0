"""Spend: reports, the guarded tally, the fleet's budget of guards, the settle, and money() for people."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from stellafleet.core.status import StopReason

if TYPE_CHECKING:
    from stellafleet.core.workercontext import WorkerContext

# No honest report comes near these: a larger figure is a bug or an attack.
MAX_REPORT_USD = 100_000.0
MAX_REPORT_COUNT = 10**12
# Below this the difference is float rounding in adding the same reports up twice, not lost money.
EPSILON_USD = 1e-9


def check_usd(value: object, what: str = "spend_usd") -> float:
    """value as dollars when it is a finite, non-negative amount up to MAX_REPORT_USD; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a non-negative number of dollars, not {value!r}")
    if not (math.isfinite(value) and 0 <= value <= MAX_REPORT_USD):
        raise ValueError(
            f"{what} must be a non-negative number of dollars (at most {MAX_REPORT_USD:g}), not {value!r}"
        )
    return float(value)


def check_count(value: object, what: str) -> int:
    """value as a count (tokens, steps) when it is a whole number from 0 up to MAX_REPORT_COUNT."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPORT_COUNT:
        limit = f"whole, at most {MAX_REPORT_COUNT:,}"
        raise ValueError(f"{what} must be a non-negative number ({limit}), not {value!r}")
    return value


class SpendReporter(Protocol):
    """Where a spender's reports go; cached input tokens are passed only when a report has some."""

    def add(self, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0) -> None: ...


class Totals(Protocol):
    """What a finished attempt claims it spent (a PipelineResult)."""

    spend_usd: float
    input_tokens: int
    output_tokens: int
    steps: int


class SpendTally:
    """The running totals of one spender, answering for the worker's guard; thread-safe."""

    def __init__(self, inner: SpendReporter | None = None, *, guard_usd: float | None = None) -> None:
        self.inner = inner
        self.guard_usd = guard_usd
        self.usd = 0.0
        self.input_tokens = 0
        self.output_tokens = 0
        self.steps = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self._lock = threading.Lock()

    @classmethod
    def for_attempt(cls, ctx: WorkerContext, spend: SpendReporter) -> SpendTally:
        """A tally under ctx's guard (STELLA_SPEND_GUARD) that passes every report on to spend."""
        return cls(spend, guard_usd=ctx.spend_guard_usd)

    def record(
        self, usd: float, input_tokens: int, output_tokens: int, steps: int, cached: tuple[int, int] = (0, 0)
    ) -> None:
        """Where a report lands; counted only once this returns. cached: (cache read, cache write) tokens."""
        if self.inner is not None:
            names = ("cache_read_tokens", "cache_write_tokens")  # only those the report has
            extra = {name: count for name, count in zip(names, cached, strict=True) if count}
            self.inner.add(usd, input_tokens=input_tokens, output_tokens=output_tokens, steps=steps, **extra)

    def add(
        self,
        usd: float,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        steps: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        with self._lock:
            self.record(usd, input_tokens, output_tokens, steps, (cache_read_tokens, cache_write_tokens))
            self.usd += usd
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            self.steps += steps
            self.cache_read_tokens += cache_read_tokens
            self.cache_write_tokens += cache_write_tokens

    def totals(self) -> dict[str, Any]:
        """The totals under a pipeline result's names."""
        return {
            "spend_usd": self.usd,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
        }

    @property
    def guarded(self) -> bool:
        return self.guard_usd is not None

    def no_room_for(self, worst_usd: float) -> str | None:
        """Why a call that could cost up to worst_usd may not be made under the guard (None: it may)."""
        if self.guard_usd is None or self.usd + worst_usd <= self.guard_usd:
            return None
        return (
            f"spent {money(self.usd)} of the {money(self.guard_usd)} guard, and the next model call could "
            f"cost up to {money(worst_usd)}"
        )

    def guard_reached(self, how: str) -> str | None:
        """Why an agent CLI must be stopped once its spend (known `how`) reached the guard; None before."""
        if self.guard_usd is None or self.usd < self.guard_usd:
            return None
        return f"spend guard of {money(self.guard_usd)} reached ({money(self.usd)} {how})"

    def guard_text(self) -> str | None:
        """The guard for people (`$0.25`); None without one."""
        return None if self.guard_usd is None else money(self.guard_usd)

    def cli_budget(self) -> str | None:
        """The guard as an agent CLI's own budget (--max-budget-usd), rounded down so it never overspends."""
        if self.guard_usd is None:
            return None
        return f"{math.floor(self.guard_usd * 10_000) / 10_000:.4f}"

    def settle(self, result: Totals) -> None:
        """Report what the result claims beyond what was reported: spend claimed is spend reported."""
        extra = {name: max(0, getattr(result, name) - value) for name, value in self.totals().items()}
        extra_usd = float(extra.pop("spend_usd"))
        if extra_usd > 1e-12 or any(extra.values()):
            self.add(extra_usd, **extra)
        for name, value in self.totals().items():
            setattr(result, name, value)


class RunningTotal:
    """A CLI's own running total of dollars (aider's `total_cost`) as the step each new total adds."""

    def __init__(self) -> None:
        self.total = 0.0

    def step(self, total: float | None, cost: float | None) -> float:
        """This call's dollars: its step in the running total when there is one, else its own cost."""
        if total is not None and total >= self.total:
            step, self.total = total - self.total, total
            return step
        return cost if cost is not None else 0.0


class SpendLedger(Protocol):
    """The part of the ledger the settle needs (state.ledger.Ledger's spend table)."""

    def of_attempt(self, attempt_id: int) -> float: ...

    def add(self, attempt_id: int, usd: float) -> Any: ...


def settle_attempt(ledger: SpendLedger, attempt_id: int, reported: Iterable[float]) -> float:
    """Record what an ended attempt's worker reported beyond what the ledger holds; the dollars added."""
    missing = max(reported, default=0.0) - ledger.of_attempt(attempt_id)
    if missing <= EPSILON_USD:
        return 0.0
    ledger.add(attempt_id, missing)
    return missing


def spend_range(amounts: Iterable[float]) -> tuple[float, float]:
    """(median, 90th percentile) of past attempts' dollars or seconds (nearest rank); (0, 0) for none."""
    ordered = sorted(amounts)
    if not ordered:
        return 0.0, 0.0
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return median, ordered[max(0, -(-9 * len(ordered) // 10) - 1)]  # ceil(0.9 n), in integers


def total_spend(ranges: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Tasks' (median, 90th percentile) dollars added up into the run's, each figure on its own."""
    pairs = list(ranges)
    return sum(pair[0] for pair in pairs), sum(pair[1] for pair in pairs)


def where_limit_stops(expected: Iterable[tuple[str, float]], limit: float) -> str | None:
    """The task (in start order) at which the run's spend likely reaches limit; None: it likely holds."""
    total = 0.0
    for task_id, usd in expected:
        total += usd
        if total > limit + EPSILON_USD:
            return task_id
    return None


def task_guard(fleet_guard: float | None, max_spend: float | None) -> float | None:
    """A task's worker's guard: the smaller of the fleet's share and the task's max_spend (None: neither)."""
    caps = [cap for cap in (fleet_guard, max_spend) if cap is not None]
    return min(caps) if caps else None


def spend_stop_text(spent: float, limit: float) -> str:
    return f"{StopReason.SPEND_LIMIT}: {money(spent)} of {money(limit)}"


def overspent(spent: float, limit: float | None) -> str | None:
    """Why a run's recorded total passed its limit (a worker reported past its guard), or None."""
    if limit is None or spent <= limit:
        return None
    return f"spend limit passed: {money(spent)} recorded, over --spend-limit {money(limit)}"


class NoBudget(Exception):
    """No guard of at least the minimum is left for another worker; the message is the reason shown."""


class SpendBudget:
    """A run's spend limit, handed out as its workers' guards so the total never passes it: a running worker
    holds its whole guard until it ends. Thread-safe."""

    def __init__(self, limit: float, concurrency: int, *, min_guard: float, spent: float = 0.0) -> None:
        self.limit = limit
        self.per_worker = limit / max(1, concurrency)
        self.min_guard = min_guard
        self._spent = spent  # by attempts that ended
        self._held: dict[str, float] = {}  # task id -> the guard of its running worker
        self._lock = threading.Lock()

    def _left(self) -> float:
        return self.limit - self._spent - sum(self._held.values())

    def reached(self, spent: float) -> str | None:
        """Why the run stops once its total spent reached the limit, else None."""
        return spend_stop_text(spent, self.limit) if spent >= self.limit else None

    def before_start(
        self, spent: float, on_reached: Callable[[float, float], None] | None = None
    ) -> str | None:
        """Why no new wave or task may start, the run having spent this much (None: one may)."""
        reason = self.reached(spent)
        if reason is not None and on_reached is not None:
            on_reached(spent, self.limit)
        return reason or self.exhausted()

    def exhausted(self) -> str | None:
        """Why no further worker can start (None: one can)."""
        with self._lock:
            return self._why_not(min(self.per_worker, self._left()))

    def _why_not(self, guard: float) -> str | None:
        if guard >= self.min_guard and guard > 0:
            return None
        used = self.limit - max(0.0, self._left())
        return (
            f"{spend_stop_text(used, self.limit)} spent or held by running workers, "
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

    def release(self, task_id: str, spent: float | None) -> None:
        """task_id's worker ended having spent this much (None: unknown, so its whole guard counts)."""
        with self._lock:
            guard = self._held.pop(task_id, None)
            if guard is not None:
                self._spent += guard if spent is None else spent


MONEY_PLAIN_MAX = 1e12  # dollars from which money() writes the amount in exponent form


def money(usd: float | None) -> str:
    """Dollars for people, as the dashboard's fmtUsd writes them: `$1.50`, `$0.0035`, `-` when unknown."""
    if usd is None:
        return "-"
    if not math.isfinite(usd):
        return "$?"
    sign, value = ("-", -usd) if usd < 0 else ("", usd)
    if value >= MONEY_PLAIN_MAX:  # a limit of 1e308 is no 309-digit amount
        return f"{sign}${value:.3g}"
    decimals = 4
    if 0 < value < 0.00005:
        decimals = min(12, 1 - math.floor(math.log10(value)))
    whole, _, fraction = f"{value:.{decimals}f}".partition(".")
    fraction = fraction.rstrip("0").ljust(2, "0")
    if whole == "0" and fraction.strip("0") == "":
        sign = ""
    return f"{sign}${whole}.{fraction}"
