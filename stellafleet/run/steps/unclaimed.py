"""Writes outside claims: the files a shared attempt changed that neither it nor another running task
claims, named in its summary and the ledger (`unclaimed_writes`); `[fleet] strict_claims` fails it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git import gitops
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings
from stellafleet.run.steps.claims import covered
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

Stamp = tuple[int, int] | None  # a file's modification time and size (None: no such file)


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
    def __init__(self, settings: RunSettings, ledger: Ledger, store: ClaimStore) -> None:
        self.root = settings.root
        self.strict = settings.config.fleet.strict_claims
        self.ledger = ledger
        self.store = store
        self._before: dict[int, Mapping[str, Stamp]] = {}  # attempt id -> the tree as it started

    def before_start(self, attempt: AttemptState) -> None:
        if attempt.ctx.shared:
            self._before[attempt.ctx.attempt_id] = stamps(self.root)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        before = self._before.pop(ctx.attempt_id, None)
        if before is None:
            return end
        changed = [path for path, stamp in stamps(self.root).items() if before.get(path, ()) != stamp]
        own = self.store.paths_of_attempt(ctx.run_id, ctx.attempt_id)
        others = [path for path, holder in self.store.claims() if holder.is_alive()]
        claims = [*attempt.task.claims, *own, *others]
        unclaimed = sorted(path for path in changed if not covered(path, claims))
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

    def released(self, attempt: AttemptState) -> None:
        if attempt.context is not None:
            self._before.pop(attempt.ctx.attempt_id, None)
