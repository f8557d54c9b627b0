"""The merge train's decisions (docs/merge.md#the-train), apart from git: which branches go into the next
batch (pairwise disjoint, dependencies landed or earlier in it), how the window adapts, and which prefixes of
a red batch a bisection checks next. Pure functions: the same queue gives the same batch every time."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from stellafleet.merge.queue import MergeItem


def _meets(a: str, b: str) -> bool:
    """Whether two paths (or claim patterns, or folders) can name the same file."""
    if a == b or fnmatch.fnmatchcase(a, b) or fnmatch.fnmatchcase(b, a):
        return True
    a_dir, b_dir = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b_dir) or b.startswith(a_dir)


def overlaps(a: Collection[str], b: Collection[str]) -> bool:
    return bool(set(a) & set(b)) or any(_meets(x, y) for x in a for y in b)


def take_batch(
    pending: Sequence[MergeItem],
    window: int,
    footprint: Mapping[str, Collection[str]],
    waiting_on: Callable[[MergeItem], Collection[str]],
) -> list[MergeItem]:
    """Up to window items of pending, in queue order, whose footprints (task id -> changed paths and claims)
    are pairwise disjoint and whose dependencies not yet landed (waiting_on) are earlier in the batch; an
    item that overlaps one taken waits for a later batch. The first item is always taken."""
    batch: list[MergeItem] = []
    taken: set[str] = set()
    for item in pending:
        if len(batch) >= window:
            break
        if batch and not set(waiting_on(item)) <= taken:
            continue
        if any(overlaps(footprint.get(item.task_id, ()), footprint.get(b.task_id, ())) for b in batch):
            continue
        batch.append(item)
        taken.add(item.task_id)
    return batch


@dataclass
class Window:
    """Zuul's window: start, +1 after each landed batch up to largest, halved after a red one, floor 1."""

    size: int
    largest: int

    def landed(self) -> None:
        self.size = min(self.size + 1, max(self.largest, self.size))

    def red(self) -> None:
        self.size = max(1, self.size // 2)


def probes(lo: int, hi: int, parallel: int) -> list[int]:
    """The prefix lengths a bisection checks next, at once, given prefix lo is green and prefix hi red:
    up to `parallel` points splitting (lo, hi) evenly; never hi itself (the last member is not retested)."""
    inner = hi - lo - 1
    if inner <= 0:
        return []
    count = min(parallel, inner)
    return sorted({lo + (inner + 1) * k // (count + 1) for k in range(1, count + 1)} - {lo, hi})


def narrow(lo: int, hi: int, verdicts: Mapping[int, bool]) -> tuple[int, int]:
    """(lo, hi) after the probes' verdicts (prefix length -> green): the longest green prefix before the
    first red one, and that first red one."""
    for point in sorted(verdicts):
        if not lo < point < hi:
            continue
        if verdicts[point]:
            lo = point
        else:
            return lo, point
    return lo, hi


def undecided(exit_code: int | None, problem: str | None, tail: str, retry_on: Sequence[str]) -> bool:
    """Whether a red check did not decide: stopped by its timeout or a signal (no exit code, or a negative
    one), or its output matches a `[merge] retry_on` pattern."""
    if problem is not None or exit_code is None or exit_code < 0:
        return True
    return any(re.search(pattern, tail, re.MULTILINE) for pattern in retry_on)
