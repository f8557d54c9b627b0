"""Writes outside claims: the files a shared attempt changed that neither it nor another running task
claims, named in its summary and the ledger (`unclaimed_writes`); `[fleet] strict_claims` fails it.
A write is attributed by who could have made it: a file another shared attempt of this fleet claims is that
attempt's only when its last write fell while that attempt held the claim (its window, from its start to
its end), so an attempt that ended first is not taken for a later one's writes, nor a later one for an
earlier writer's."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git import gitops
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings
from stellafleet.run.steps.claims import covered
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

Stamp = tuple[int, int] | None  # a file's modification time and size (None: no such file)
# how far a claimant's window reaches past its start and end: file times are coarse (a jiffy on some file
# systems), and a write at the edge is the claimant's (an intruder is named only when it is one)
EDGE_NS = 50_000_000


@dataclass
class Window:
    """One shared attempt of this fleet: what it claims and when it could write (end None: still running)."""

    claims: Sequence[str]
    start_ns: int
    end_ns: int | None = None

    def could_have_written(self, path: str, stamp: Stamp, since_ns: int, now_ns: int) -> bool:
        """Whether this attempt claims path and ran when its last change (stamp; None: a deletion, some
        time after since_ns) was made."""
        if not covered(path, self.claims):
            return False
        end = (self.end_ns if self.end_ns is not None else now_ns) + EDGE_NS
        if stamp is None:
            return end >= since_ns
        return self.start_ns - EDGE_NS <= stamp[0] <= end


def stamps(root: Path) -> dict[str, Stamp]:
    """Every file of the tree that differs from HEAD, stamped."""
    found: dict[str, Stamp] = {}
    for path in gitops.changed_paths(root):
        if path.startswith(EXCLUDED_DIRS):
            continue
        try:
            stat = os.stat(root / path)
            found[path] = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            found[path] = None
    return found


class UnclaimedWrites(AttemptStep):
    def __init__(
        self,
        settings: RunSettings,
        ledger: Ledger,
        store: ClaimStore,
        *,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.root = settings.root
        self.now_ns = now_ns  # the file system's clock (file times are compared with it); tests set their own
        self.strict = settings.config.fleet.strict_claims
        self.ledger = ledger
        self.store = store
        self._before: dict[int, Mapping[str, Stamp]] = {}  # attempt id -> the tree as it started
        self._windows: dict[int, Window] = {}  # attempt id -> its claims and when it ran (this fleet's)

    def before_start(self, attempt: AttemptState) -> None:
        if attempt.ctx.shared:
            self._windows[attempt.ctx.attempt_id] = Window(attempt.task.claims, self.now_ns())
            self._before[attempt.ctx.attempt_id] = stamps(self.root)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        before = self._before.pop(ctx.attempt_id, None)
        if before is None:
            return end
        window = self._windows[ctx.attempt_id]
        window.claims = [*window.claims, *self.store.paths_of_attempt(ctx.run_id, ctx.attempt_id)]
        window.end_ns = self.now_ns()
        changed = {path: stamp for path, stamp in stamps(self.root).items() if before.get(path, ()) != stamp}
        others = self._others(ctx.run_id, ctx.attempt_id)
        unclaimed = sorted(
            path
            for path, stamp in changed.items()
            if not covered(path, window.claims) and not others(path, stamp, window.start_ns)
        )
        self.ledger.attempts.set_unclaimed_writes(ctx.attempt_id, unclaimed)
        if not unclaimed:
            return end
        said = f"changed files it did not claim: {', '.join(unclaimed)}"
        if self.strict and end.outcome == AttemptOutcome.SUCCEEDED:
            failed = f"{said} ([fleet] strict_claims)"
            return replace(
                end, outcome=AttemptOutcome.FAILED, summary=f"{end.summary}; {failed}", error=failed
            )
        return replace(end, summary=f"{end.summary}; {said}" if end.summary else said)

    def _others(self, run_id: str, attempt_id: int) -> Callable[[str, Stamp, int], bool]:
        """Whether another attempt could have made a change to a path (its stamp, made after since_ns):
        one of this fleet's that claims the path and ran when it was made, or a live holder of the path's
        claim elsewhere (another fleet, a user's tool)."""
        # a running attempt's claims include those it took since it started (its claim hook's, its commits')
        ours = [
            window
            if window.end_ns is not None
            else replace(window, claims=[*window.claims, *self.store.paths_of_attempt(run_id, i)])
            for i, window in list(self._windows.items())  # a list: other threads add theirs
            if i != attempt_id
        ]
        now = self.now_ns()
        elsewhere = [
            held
            for held, holder in self.store.claims()
            if not (holder.run_id == run_id and holder.attempt_id in self._windows) and holder.is_alive()
        ]

        def could_have(path: str, stamp: Stamp, since_ns: int) -> bool:
            return covered(path, elsewhere) or any(
                w.could_have_written(path, stamp, since_ns, now) for w in ours
            )

        return could_have

    def released(self, attempt: AttemptState) -> None:
        if attempt.context is not None:
            self._before.pop(attempt.ctx.attempt_id, None)
            window = self._windows.get(attempt.ctx.attempt_id)
            if window is not None and window.end_ns is None:  # it never ended (its worker never started)
                window.end_ns = self.now_ns()
