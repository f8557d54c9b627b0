"""What the watch is made of: one watched branch, the result of a watch, and where its events go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stellafleet.ci.gh import CiRun
from stellafleet.ci.targets import Target
from stellafleet.core.errors import EXIT_OK, EXIT_WATCH_RED
from stellafleet.core.status import CIState


@dataclass
class BranchWatch:
    """One watched branch, from push to its final CI state."""

    target: Target
    head_sha: str | None = None
    pr_url: str | None = None
    pr_number: int | None = None
    pr_body: str | None = None
    state: CIState = CIState.PENDING
    conclusion: str | None = None
    reason: str | None = None
    phase: str = "starting"
    runs: list[CiRun] = field(default_factory=list)
    since: float = 0.0
    last_change: float = 0.0
    ended_at: float | None = None
    seen: tuple[Any, ...] | None = None
    gh_trouble: str | None = None
    fix_rounds: int = 0  # --fix-ci rounds run for this branch
    fix_note: str | None = None  # why the last round left it red

    @property
    def branch(self) -> str:
        return self.target.branch

    @property
    def done(self) -> bool:
        return self.state.settled

    @property
    def run_urls(self) -> list[str]:
        return [r.url for r in self.runs if r.url]

    def to_json(self, start: float) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "kind": self.target.kind,
            "task_id": self.target.task_id,
            "tasks": [t.id for t in self.target.tasks],
            "head_sha": self.head_sha,
            "pr_number": self.pr_number,
            "pr_url": self.pr_url,
            "state": str(self.state),
            "conclusion": self.conclusion,
            "reason": self.reason,
            "run_urls": self.run_urls,
            "fix_rounds": self.fix_rounds,
            "runs": [r.to_json() for r in self.runs],
            "elapsed_s": None if self.ended_at is None else round(self.ended_at - start, 3),
        }


@dataclass
class WatchResult:
    run_id: str
    remote: str | None
    branches: list[BranchWatch]
    message: str | None = None
    start: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(b.state == CIState.GREEN for b in self.branches) else EXIT_WATCH_RED

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "remote": self.remote,
            "exit_code": self.exit_code,
            "message": self.message,
            "branches": [b.to_json(self.start) for b in self.branches],
        }


class WatchReporter(Protocol):
    """Where watch tells what happens: an event sink, so the fleet can fold it into its own output."""

    def note(self, message: str) -> None: ...

    def changed(self, watch: BranchWatch) -> None:
        """A branch's state or phase changed (called once per change)."""
        ...

    def finished(self, result: WatchResult) -> None: ...
