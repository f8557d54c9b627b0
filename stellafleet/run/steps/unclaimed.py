"""Writes outside claims: the files a shared attempt changed that neither it nor another task that could
have written them claims, named in its summary and the ledger (`unclaimed_writes`); `[fleet] strict_claims`
fails it.
A write is attributed by who could have made it: a file another shared attempt of this fleet claims is that
attempt's only when its last write fell while that attempt could write it: within its write spans when its
pipeline reports them (the engine's writing tool calls, Claude Code's hooked ones, Codex's commands and
patches: state/claims.py), else from its start to its end. So an attempt that ended first is not taken for
a later one's writes, nor a later one for an earlier writer's, nor a running claimant for a write made
between its tool calls; and the claimant is told when its file was last changed so, while another task
ran."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from stat import S_ISREG

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git import gitops
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings
from stellafleet.run.steps.claims import covered
from stellafleet.state.claims import ClaimStore, Span
from stellafleet.state.ledger import Ledger

Stamp = tuple[int, int] | None  # a file's modification time and size (None: no such file)
# how far a claimant's window reaches past its start and end: file times are coarse (a jiffy on some file
# systems), and a write at the edge is the claimant's (an intruder is named only when it is one)
EDGE_NS = 50_000_000


@dataclass
class Window:
    """One shared attempt of this fleet: what it claims and when it could write (end None: still running;
    spans None: its pipeline reports none, so at any moment of its run)."""

    task_id: str
    claims: Sequence[str]
    start_ns: int
    end_ns: int | None = None
    spans: Sequence[Span] | None = None

    def could_have_written(self, path: str, stamp: Stamp, since_ns: int, now_ns: int) -> bool:
        """Whether this attempt claims path and could write when its last change (stamp; None: a
        deletion, some time after since_ns) was made."""
        return covered(path, self.claims) and self.could_write_at(stamp, since_ns, now_ns)

    def could_write_at(self, stamp: Stamp, since_ns: int, now_ns: int) -> bool:
        """Whether this attempt could write the tree when a change (stamp, as above) was made."""
        end = self.end_ns if self.end_ns is not None else now_ns
        spans = [(self.start_ns, end)] if self.spans is None else self.spans
        for start, span_end in spans:  # an open span lasts to the attempt's end
            last = (end if span_end is None else span_end) + EDGE_NS
            if stamp is None and last >= since_ns:
                return True
            if stamp is not None and start - EDGE_NS <= stamp[0] <= last:
                return True
        return False


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
            self._windows[attempt.ctx.attempt_id] = Window(
                attempt.task.id, attempt.task.claims, self.now_ns()
            )
            self._before[attempt.ctx.attempt_id] = stamps(self.root)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        before = self._before.pop(ctx.attempt_id, None)
        if before is None:
            return end
        window = self._windows[ctx.attempt_id]
        window.claims = [*window.claims, *self.store.paths_of_attempt(ctx.run_id, ctx.attempt_id)]
        window.end_ns = self.now_ns()
        window.spans = self.store.write_spans(ctx.run_id, ctx.attempt_id)
        changed = {path: stamp for path, stamp in stamps(self.root).items() if before.get(path, ()) != stamp}
        others, now = self._others(ctx.run_id, ctx.attempt_id), self.now_ns()
        unclaimed = sorted(
            path
            for path, stamp in changed.items()
            if not covered(path, window.claims)
            and not any(other.could_have_written(path, stamp, window.start_ns, now) for other in others)
        )
        self.ledger.attempts.set_unclaimed_writes(ctx.attempt_id, unclaimed)
        if unclaimed:
            said = f"changed files it did not claim: {', '.join(unclaimed)}"
            if self.strict and end.outcome == AttemptOutcome.SUCCEEDED:
                failed = f"{said} ([fleet] strict_claims)"
                end = replace(
                    end, outcome=AttemptOutcome.FAILED, summary=f"{end.summary}; {failed}", error=failed
                )
            else:
                end = replace(end, summary=f"{end.summary}; {said}" if end.summary else said)
        for note in _changed_between_calls(window, self._own_files(window, changed), others, now):
            end = replace(end, summary=f"{end.summary}; {note}" if end.summary else note)
        return end

    def _own_files(self, window: Window, changed: Mapping[str, Stamp]) -> dict[str, Stamp]:
        """The files it claims that changed while it ran: those that differ from HEAD, and the files it
        claimed by name that were changed since it started and are committed now."""
        own = {path: stamp for path, stamp in changed.items() if covered(path, window.claims)}
        for path in window.claims:
            with contextlib.suppress(OSError):
                stat = os.stat(self.root / path)
                if path not in own and S_ISREG(stat.st_mode) and stat.st_mtime_ns > window.start_ns:
                    own[path] = (stat.st_mtime_ns, stat.st_size)
        return own

    def _others(self, run_id: str, attempt_id: int) -> list[Window]:
        """Who else could have changed a file: this fleet's other shared attempts (a running one's claims
        and spans as they are now: its claim hook's, its commits') and, as one window that never closes,
        the live holders of claims elsewhere (another fleet, a user's tool)."""
        ours = [
            window
            if window.end_ns is not None
            else replace(
                window,
                claims=[*window.claims, *self.store.paths_of_attempt(run_id, i)],
                spans=self.store.write_spans(run_id, i),
            )
            for i, window in list(self._windows.items())  # a list: other threads add theirs
            if i != attempt_id
        ]
        elsewhere = [
            held
            for held, holder in self.store.claims()
            if not (holder.run_id == run_id and holder.attempt_id in self._windows) and holder.is_alive()
        ]
        return [*ours, Window("", elsewhere, 0)]

    def released(self, attempt: AttemptState) -> None:
        if attempt.context is not None:
            ctx = attempt.ctx
            self._before.pop(ctx.attempt_id, None)
            window = self._windows.get(ctx.attempt_id)
            if window is not None and window.end_ns is None:  # it never ended (its worker never started)
                window.end_ns = self.now_ns()
                window.spans = self.store.write_spans(ctx.run_id, ctx.attempt_id)
            if window is not None and window.spans is not None:  # kept in its window from here on
                self.store.drop_spans(ctx.run_id, ctx.attempt_id)


def _changed_between_calls(
    window: Window, own: Mapping[str, Stamp], others: Sequence[Window], now_ns: int
) -> list[str]:
    """What the claimant is told of its own files last changed outside its write spans while another
    task of this fleet that does not claim them ran: that change may be that task's, not its own."""
    if window.spans is None:
        return []
    notes = []
    for path, stamp in sorted(own.items()):
        if stamp is None or window.could_write_at(stamp, 0, now_ns):
            continue
        ran = [
            w.task_id
            for w in others
            if w.task_id and not covered(path, w.claims) and w.could_write_at(stamp, 0, now_ns)
        ]
        if ran:
            notes.append(
                f"{path} was last changed outside this task's tool calls (while {', '.join(ran)} ran)"
            )
    return notes
