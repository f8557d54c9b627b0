"""What `stella merge` is asked (MergeOptions) and what it did (MergeResult), shared by its local queue
(merge/runner.py, merge/batch.py) and --via-gh (merge/viagh.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE
from stellafleet.core.status import MergeStatus
from stellafleet.merge.journal import Journal
from stellafleet.merge.queue import MergeItem
from stellafleet.merge.resolve import Resolution

FAILED = (MergeStatus.CONFLICT, MergeStatus.CHECK_FAILED, MergeStatus.ERROR)


@dataclass(frozen=True)
class MergeOptions:
    """What `stella merge` was asked to do: the command line over [merge] in the config."""

    run_ref: str | None = None
    dry_run: bool = False
    unwatched: bool = False
    strategy: str = "rebase"
    check: str | None = None
    check_timeout: float = 1800.0
    check_tail_lines: int = 20
    worktree: WorktreeConfig = field(default_factory=WorktreeConfig)  # how each check tree is readied
    init_submodules: bool = True  # [fleet] init_submodules: each check tree gets the main tree's submodules
    window: int = 8  # the train's first batch size; 1: one branch at a time (--serial)
    max_window: int = 32
    parallel_checks: int = 1
    check_retries: int = 1
    retry_on: tuple[str, ...] = ()
    fix_rounds: int = 0  # --fix N: rounds an evicted branch goes back to its task's worker


@dataclass
class MergeResult:
    run_id: str
    onto: str
    options: MergeOptions
    start_sha: str
    end_sha: str
    queue: list[MergeItem] = field(default_factory=list)
    left_out: list[MergeItem] = field(default_factory=list)
    open_prs: dict[str, int] = field(default_factory=dict)  # branch landed here -> the PR --watch opened
    batches: list[dict[str, Any]] = field(default_factory=list)  # the train's, as merge_batches rows say
    check_runs: int = 0  # how many times a check command set ran (each retry and bisection step counts)
    refusal: str | None = None  # --dry-run: why the real merge will refuse to start

    @property
    def exit_code(self) -> int:
        if self.refusal is not None:
            return EXIT_USAGE
        return EXIT_TASK_FAILED if any(item.status in FAILED for item in self.queue) else EXIT_OK

    def count(self, status: MergeStatus) -> int:
        return sum(1 for item in self.queue if item.status == status)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "onto": self.onto,
            "strategy": self.options.strategy,
            "check": self.options.check,
            "dry_run": self.options.dry_run,
            "start_sha": self.start_sha,
            "end_sha": self.end_sha,
            "exit_code": self.exit_code,
            "queue": [item.to_json() for item in self.queue],
            "left_out": [item.to_json() for item in self.left_out],
            "refusal": self.refusal,
            "open_prs": [{"branch": branch, "pr_number": n} for branch, n in self.open_prs.items()],
            "batches": self.batches,
            "check_runs": self.check_runs,
        }


Progress = Callable[[MergeItem], None]
Say = Callable[[str], None]  # one progress line of the train (`batch 3: 5 branches: a, b, c, d, e`)


class Resolving(Protocol):
    """--resolve: hands a conflicting branch to a worker (merge/resolve.py's Resolver)."""

    def resolve(
        self, item: MergeItem, onto: str, tip: str, files: tuple[str, ...], diff: str, journal: Journal
    ) -> Resolution: ...
