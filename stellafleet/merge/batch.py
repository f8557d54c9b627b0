"""The merge train (docs/merge.md#the-train): batches of disjoint branches built one after another onto the
tip in one tree, checked once, landed as one; a red batch bisected (its green prefix lands, the culprit is
confirmed alone on the tip before it is evicted); an evicted branch goes back to its task as a request."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stellafleet.core.errors import GitError
from stellafleet.core.status import FollowUpReason, MergeStatus, RequestState
from stellafleet.git import mergeops
from stellafleet.merge.journal import Journal
from stellafleet.merge.options import MergeOptions, MergeResult, Progress, Resolving
from stellafleet.merge.queue import MergeItem
from stellafleet.merge.resolve import conflict_context
from stellafleet.merge.train import Window, narrow, probes, take_batch, undecided
from stellafleet.state.ledger import Ledger

if TYPE_CHECKING:
    from stellafleet.run.checking import CheckRun

CONTEXT_BYTES = 12_000  # of the conflict's diff or the check's tail an eviction request carries
# what the request's context says of the worktree it is served in (merge/evicted.py)
WORKTREE_NOTE = (
    "Your worktree has been moved onto that new tip: rebased when that was clean; else it holds the new tip "
    "with your branch's work applied and the conflicts left in the files (resolve them, keep both sides' "
    "intent). Make it pass its checks on top of the landed work and commit."
)


class Lander(Protocol):
    """The queue's one-branch steps and state (merge/runner.py's _Queue) the train builds on."""

    root: Path
    ledger: Ledger
    result: MergeResult
    options: MergeOptions
    progress: Progress
    resolver: Resolving | None
    journal: Journal
    tip: str
    not_landed: set[str]

    def scratch_tree(self) -> contextlib.AbstractContextManager[Path]: ...
    def _skipped(self, item: MergeItem) -> bool: ...
    def _record(self, item: MergeItem, merge_id: int | None) -> None: ...
    def _start_row(self, item: MergeItem, batch_id: int | None = None) -> int: ...
    def _apply(self, item: MergeItem, worktree: Path, onto: str) -> mergeops.StepResult: ...
    def _check(self, members: Sequence[MergeItem], head: str, merge_id: int) -> CheckRun | None: ...
    def _advance(self, members: Sequence[MergeItem], new: str) -> None: ...


class Fixing(Protocol):
    """--fix N: an evicted branch's task worker, served its eviction request (merge/evicted.py)."""

    def fix(self, item: MergeItem, request_id: int, tip: str) -> str | None: ...


@dataclass
class Built:
    """A batch member rebased onto the ones before it: head is the prefix up to and including it."""

    item: MergeItem
    head: str


@dataclass
class BatchRecord:
    number: int
    window: int
    members: list[str]
    batch_id: int
    steps: list[dict[str, Any]] = field(default_factory=list)


class Train:
    """The queue's branches landed batch after batch, on the _Queue's tip, worktree and ledger."""

    def __init__(self, queue: Lander, fixer: Fixing | None, say: Callable[[str], None]) -> None:
        self.q, self.fixer, self.say = queue, fixer, say
        options = queue.options
        self.window = Window(options.window, options.max_window)
        self.landed: set[str] = set()
        self.evicted: list[tuple[MergeItem, int]] = []  # with the request that hands each back
        self.number = 0
        self.batch_id: int | None = None  # the merge_batches row of the batch under way
        self.fixing = False  # this round's evictions are served by --fix (else they wait on you)
        self.stopped: str | None = None  # why the train stopped (a git step failed: the branch moved)
        self.red: dict[int, str] = {}  # prefix length -> how its last check failed, in the current batch

    def run_rounds(self) -> None:
        """The queue landed; then, with --fix N, each round's evictions fixed by their tasks, tried again
        (the evictions an earlier merge left waiting on you are served first)."""
        pending = list(self.q.result.queue)
        rounds = self.q.options.fix_rounds if self.fixer is not None else 0
        if self.fixer is not None:
            self._fixed(self.fixer, self._waiting(pending))
        with self.q.scratch_tree() as worktree:
            for round_ in range(rounds + 1):
                self.fixing = round_ < rounds  # the last round's evictions wait on you
                self.run(pending, worktree)
                if self.fixer is None or not self.evicted or not self.fixing:
                    break
                evicted, self.evicted = self.evicted, []
                pending = self._fixed(self.fixer, evicted)

    def _waiting(self, queue: Sequence[MergeItem]) -> list[tuple[MergeItem, int]]:
        """The evictions an earlier merge left waiting on you, of the branches in the queue: each its
        request asked again, now to be served."""
        q, items = self.q, {item.branch: item for item in queue}
        found: list[tuple[MergeItem, int]] = []
        for row in q.ledger.requests.needing_you(q.result.run_id):
            item = items.get(row["branch"] or "")
            if row["reason"] != FollowUpReason.EVICTED or item is None:
                continue
            q.ledger.requests.dismiss(q.result.run_id, item.task_id, item.branch, FollowUpReason.EVICTED,
                                      "served by stella merge --fix")  # fmt: skip
            request_id = q.ledger.requests.ask(
                q.result.run_id, item.task_id, FollowUpReason.EVICTED, row["context"],
                asked_by="stella merge", branch=item.branch,
            )  # fmt: skip
            found.append((item, request_id))
        return found

    def _fixed(self, fixer: Fixing, evicted: list[tuple[MergeItem, int]]) -> list[MergeItem]:
        """Each eviction served by its task's worker; the branches that have new work to try again."""
        back: list[MergeItem] = []
        for item, request_id in evicted:
            self.say(f"fix: {item.branch} goes back to task {item.task_id} (request {request_id})")
            # a merge killed from here on leaves the worker running: the next stella command stops it
            self.q.journal.note(fixing={"run_id": self.q.result.run_id, "task_id": item.task_id})
            failed = fixer.fix(item, request_id, self.q.tip)
            self.q.journal.note(fixing=None)
            if failed is not None:
                self.say(f"fix: {item.task_id}: {failed}")
                if self.q.ledger.requests.take(request_id):  # never served: ended, not left open
                    self.q.ledger.requests.finish(request_id, f"not served: {failed}")
                asked = self.q.ledger.requests.get(request_id) or {}
                context = f"{asked.get('context', '')}\n(--fix: {failed})"
                self.q.ledger.requests.ask(
                    self.q.result.run_id, item.task_id, FollowUpReason.EVICTED, context,
                    asked_by="stella merge", branch=item.branch, state=RequestState.NEEDS_YOU,
                )  # fmt: skip
                continue
            self.q.not_landed.discard(item.task_id)
            item.status, item.reason, item.files, item.check_tail = MergeStatus.PLANNED, "", [], ""
            back.append(item)
        return back

    def run(self, pending: list[MergeItem], worktree: Path) -> None:
        """The pending branches landed batch after batch (each looked at once for being gone or in already;
        then, between batches, only for a dependency that did not land)."""
        footprints: dict[tuple[str, str | None, tuple[str, ...]], tuple[str, ...]] = {}
        check = self.q._skipped
        while pending:
            for item in list(pending):
                if check(item):
                    pending.remove(item)
                    self.q._record(item, None)
                    self.q.progress(item)
            check = self._dependency_failed
            if not pending:
                return
            for item in pending:  # the paths a branch changes depend on what it waits for only
                key = (item.task_id, item.head, tuple(self._waiting_on(item)))
                if key not in footprints:
                    footprints[key] = self._footprint(item)
            shapes = {
                item.task_id: footprints[item.task_id, item.head, tuple(self._waiting_on(item))]
                for item in pending
            }
            batch = take_batch(pending, self.window.size, shapes, self._waiting_on)
            for item in batch:
                pending.remove(item)
            pending[:0] = self._land_batch(batch, worktree)
            if self.stopped is not None:  # the target branch moved, say: nothing more is tried
                for item in pending:
                    item.status, item.reason = MergeStatus.ERROR, f"not tried: {self.stopped}"
                    self._settle(item)
                pending.clear()

    def _dependency_failed(self, item: MergeItem) -> bool:
        missing = [dep for dep in item.after if dep in self.q.not_landed]
        if missing:
            item.status, item.reason = (
                MergeStatus.SKIPPED,
                f"depends on {', '.join(missing)}, which did not land",
            )
            self.q.not_landed.add(item.task_id)
        return bool(missing)

    def _waiting_on(self, item: MergeItem) -> list[str]:
        return [dep for dep in item.after if dep not in self.landed]

    def _footprint(self, item: MergeItem) -> tuple[str, ...]:
        """The paths the branch changes from its start (its parent's head when stacked on one that has not
        landed, else where it meets the tip) to its head, and its plan claims."""
        assert item.head is not None
        root = self.q.root
        start = mergeops.merge_base(root, self.q.tip, item.head) or self.q.tip
        heads = {i.task_id: i.head for i in self.q.result.queue}
        for dep in self._waiting_on(item):
            parent = heads.get(dep)
            if parent and mergeops.contains(root, item.head, parent):
                start = parent
        return (*mergeops.changed_between(root, start, item.head), *item.claims)

    def _land_batch(self, batch: list[MergeItem], worktree: Path) -> list[MergeItem]:
        """Build, check and land one batch (bisecting it when red); the members that go back to the queue."""
        self.number += 1
        q = self.q
        names = [item.branch for item in batch]
        batch_id = q.ledger.merge_batches.start(
            run_id=q.result.run_id, number=self.number, window=self.window.size, members=names,
            onto_ref=q.result.onto, before_sha=q.tip,
        )  # fmt: skip
        record = BatchRecord(self.number, self.window.size, names, batch_id)
        self.batch_id = batch_id
        self.say(
            f"batch {self.number}: {len(batch)} branch{'es' if len(batch) != 1 else ''}: {', '.join(names)}"
        )
        for item in batch:
            item.batch, item.before_sha, item.reason = self.number, q.tip, ""
            item.merge_id = q._start_row(item, batch_id)
        self._journal(batch)
        outcome, combined = "landed", None
        back: list[MergeItem] = []
        try:
            built = self._build(batch, worktree, record)
            combined = built[-1].head if built else None
            if built:
                outcome, back = self._check_and_land(built, record)
            else:
                outcome = "evicted"
        except GitError as exc:
            outcome, self.stopped = "error", exc.message
            for item in batch:
                if item.status == MergeStatus.PLANNED:
                    item.status, item.reason = MergeStatus.ERROR, exc.message
                    self._settle(item)
        for item in back:
            item.status, item.reason = MergeStatus.SKIPPED, f"back in the queue after batch {self.number}"
            q._record(item, item.merge_id)
            item.status, item.reason = MergeStatus.PLANNED, ""
        q.ledger.merge_batches.finish(
            batch_id, outcome=outcome, combined_sha=combined, after_sha=q.tip, steps=record.steps
        )
        q.result.batches.append({**record.__dict__, "outcome": outcome, "combined_sha": combined})
        q.journal.note(batch=None, batch_id=None, members=[])
        return back

    def _journal(self, members: Sequence[MergeItem]) -> None:
        """The batch's members not settled yet: a killed merge's repair settles exactly these."""
        rows = [[m.merge_id, m.branch, m.head] for m in members if m.status == MergeStatus.PLANNED]
        self.q.journal.note(batch=self.number, batch_id=self.batch_id, members=rows)

    def _build(self, batch: list[MergeItem], worktree: Path, record: BatchRecord) -> list[Built]:
        """Each member rebased onto the ones before it; a conflicting one resolved (--resolve) or evicted."""
        q, built = self.q, list[Built]()
        for item in batch:
            onto = built[-1].head if built else q.tip
            step = q._apply(item, worktree, onto)
            head = step.head
            if head is None and q.resolver is not None and step.conflicts:
                fixed = q.resolver.resolve(
                    item, q.result.onto, onto, step.conflicts, step.conflict_diff, q.journal
                )
                head = fixed.head
                item.reason, item.files = (f"; {fixed.note}" if head else ""), list(step.conflicts)
                if head is None:
                    step = mergeops.StepResult(None, step.conflicts, fixed.note, step.conflict_diff)
            if head is None:
                self._evict_conflict(item, step, onto, record)
                continue
            built.append(Built(item, head))
        shown = built[-1].head[:12] if built else "nothing"
        self.say(f"batch {self.number}: tree set up at {shown} ({len(built)} of {len(batch)} rebased)")
        return built

    def _check(self, built: Sequence[Built], upto: int, record: BatchRecord, why: str) -> bool:
        """The checks of prefix built[:upto] on its head, a check that did not decide run again up to
        check_retries times; whether it passed."""
        members = [b.item for b in built[:upto]]
        head = built[upto - 1].head
        options = self.q.options
        red: CheckRun | None = None
        for attempt in range(options.check_retries + 1):
            red = self.q._check(members, head, members[-1].merge_id or 0)
            if red is None or not undecided(red.exit_code, red.problem, red.tail, options.retry_on):
                break
            if attempt < options.check_retries:
                record.steps.append({"step": "retry", "upto": upto, "attempt": attempt + 1})
        record.steps.append({"step": "check", "why": why, "upto": upto, "head": head, "passed": red is None})
        self.say(
            f"batch {self.number}: check of {upto} branch{'es' if upto != 1 else ''} at {head[:12]} "
            f"{'passed' if red is None else 'failed'} ({why})"
        )
        if red is not None:
            how = "ran out of time" if red.exit_code is None else f"exited {red.exit_code}"
            self.red[upto] = f"check `{red.command}` {how}"
        return red is None

    def _check_and_land(self, built: list[Built], record: BatchRecord) -> tuple[str, list[MergeItem]]:
        """The batch checked once; a red one checked once more (a flaky red costs one run, not a bisection),
        then bisected: its green prefix lands, the culprit, confirmed on the tip, is evicted."""
        size = len(built)
        if self._check(built, size, record, "the batch") or self._check(
            built, size, record, "the batch again"
        ):
            self._land(built, size, record)
            self.window.landed()
            return "landed", []
        self.window.red()
        _, hi = self._bisect(built, record)
        culprit = built[hi - 1]
        # red twice already when it is the last (its prefix is the batch): else one run on the new tip
        confirmed = hi == size or not self._check(
            built, hi, record, f"{culprit.item.branch} alone on the tip"
        )
        if confirmed:
            self._evict_red(culprit.item, record, hi)
        else:
            self._land(built, hi, record)  # the red was not its: a flaky check evicts no one
        return ("evicted" if size == 1 else "bisected"), [b.item for b in built[hi:]]

    def _bisect(self, built: list[Built], record: BatchRecord) -> tuple[int, int]:
        """Mergify's bisection of a red batch: prefixes checked up to parallel_checks at once, each green one
        landed; (the longest green prefix, the first red one). The last member is never retested."""
        lo, hi = 0, len(built)
        while hi - lo > 1:
            points = probes(lo, hi, self.q.options.parallel_checks)
            self.say(f"batch {self.number}: bisect: checking the first {', '.join(map(str, points))} of {hi}")
            record.steps.append({"step": "bisect", "lo": lo, "hi": hi, "points": points})
            with ThreadPoolExecutor(max_workers=len(points)) as pool:
                found = pool.map(lambda n: self._check(built, n, record, "bisect"), points)
                verdicts = dict(zip(points, found, strict=True))
            new_lo, hi = narrow(lo, hi, verdicts)
            if new_lo > lo:
                self._land(built, new_lo, record)
                lo = new_lo
        return lo, hi

    def _land(self, built: Sequence[Built], upto: int, record: BatchRecord) -> None:
        members = [b.item for b in built[:upto] if b.item.status == MergeStatus.PLANNED]
        if not members:
            return
        self.q._advance(members, built[upto - 1].head)
        for item in members:
            self.landed.add(item.task_id)
            self.q.progress(item)
        record.steps.append(
            {"step": "land", "upto": upto, "tip": self.q.tip, "branches": [m.branch for m in members]}
        )
        self._journal([b.item for b in built])

    def _settle(self, item: MergeItem) -> None:
        self.q.not_landed.add(item.task_id)
        self.q._record(item, item.merge_id)
        self.q.progress(item)

    def _evict_conflict(
        self, item: MergeItem, step: mergeops.StepResult, onto: str, record: BatchRecord
    ) -> None:
        q = self.q
        where = ", ".join(step.conflicts) if step.conflicts else step.message
        item.status, item.files = MergeStatus.CONFLICT, list(step.conflicts)
        item.reason = f"conflicts with {q.result.onto} in {where}" + (
            f"; {step.message}" if q.resolver and step.conflicts else ""
        )
        base = mergeops.merge_base(q.root, onto, item.head or onto) or onto
        landed = mergeops.landed_with(q.root, base, onto, step.conflicts)
        context = (
            f"Your branch {item.branch} conflicts with work already landed on {q.result.onto} (its tip is "
            f"now {q.tip}), in {where}.\nLanded commits it conflicts with:\n{_listed(landed)}\n"
            + conflict_context(step.conflict_diff)
        )
        self._evict(item, record, context)

    def _evict_red(self, item: MergeItem, record: BatchRecord, upto: int) -> None:
        q = self.q
        item.status = MergeStatus.CHECK_FAILED
        item.reason = (
            self.red.get(upto, "check failed")
            + item.reason.replace("; ", " (", 1)
            + (")" if item.reason else "")
        )
        landed = mergeops.landed_with(q.root, q.result.start_sha, q.tip)
        context = (
            f"Your branch {item.branch} was rebased onto {q.result.onto} (its tip is now {q.tip}) and its "
            f"checks failed there.\nCommits landed on {q.result.onto} by this merge, which it fails with:\n"
            f"{_listed(landed)}\nThe check's output (its end):\n```\n{_cut(item.check_tail)}\n```\n"
        )
        self._evict(item, record, context)

    def _evict(self, item: MergeItem, record: BatchRecord, context: str) -> None:
        """item out of the train, and back to its task as an `evicted` request (served by --fix N, else
        waiting on you)."""
        self._settle(item)
        record.steps.append(
            {"step": "evict", "branch": item.branch, "status": str(item.status), "reason": item.reason}
        )
        self.say(f"evicted: {item.branch} [{item.task_id}]: {item.reason}")
        q = self.q
        state = RequestState.OPEN if self.fixing else RequestState.NEEDS_YOU
        if self.fixing:
            context += f"\n{WORKTREE_NOTE}\n"
        request_id = q.ledger.requests.ask(
            q.result.run_id, item.task_id, FollowUpReason.EVICTED, context, asked_by="stella merge",
            branch=item.branch, state=state,
        )  # fmt: skip
        self.evicted.append((item, request_id))


def _cut(text: str) -> str:
    text = text.rstrip()
    return text if len(text) <= CONTEXT_BYTES else text[:CONTEXT_BYTES] + "\n[... the rest left out ...]"


def _listed(commits: Sequence[str]) -> str:
    return "\n".join(f"- {line}" for line in commits) or "- (none: it conflicts with the tip as it was)"
