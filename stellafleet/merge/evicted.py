"""--fix N: a branch the merge train evicted goes back to its task (docs/merge.md#evictions): the task's
worktree is first rebased onto the new tip when that is clean, else set on the new tip with the branch's
work applied and its conflicts left in the files; then the task's worker serves the `evicted` request there,
under what the run has left of its spend limit, and its result re-enters the queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.core.config import Config
from stellafleet.core.errors import GitError
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import SpendBudget, money
from stellafleet.git import gitops, mergeops
from stellafleet.git.clean import uncommitted
from stellafleet.merge.queue import MergeItem
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.steps import RunSettings, factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


class Fixer:
    """Serves one run's `evicted` requests by the tasks' own workers; opened once per `stella merge --fix`."""

    def __init__(
        self,
        root: Path,
        ledger: Ledger,
        run_id: str,
        config: Config,
        spend_limit: float | None,
        config_file: Path | None = None,
    ) -> None:
        self.root, self.ledger, self.run_id, self.config = root, ledger, run_id, config
        self.config_file = config_file.resolve() if config_file else None
        self.run = ledger.get_run(run_id)["run"]
        self.limit = spend_limit if spend_limit is not None else self.run.get("spend_limit_usd")

    def fix(self, item: MergeItem, request_id: int, tip: str) -> str | None:
        """The request served in the task's worktree moved onto tip; None when the branch has new work to try
        again, else why not."""
        spent = self.ledger.spend.of_run(self.run_id)
        budget = spend_budget(self.limit, 1, self.config, spent=spent)
        if budget is not None and budget.reached(spent):
            return f"spend limit reached ({money(spent)} of {money(budget.limit)}): left waiting on you"
        row = next(t for t in self.ledger.get_run(self.run_id)["tasks"] if t["id"] == item.task_id)
        worktree = Path(row["worktree"]) if row.get("worktree") else None
        if worktree is None or not worktree.is_dir():
            return "the task's worktree is gone (cleaned up?): left waiting on you"
        if uncommitted(worktree):
            return f"the task's worktree {worktree} has uncommitted changes: left waiting on you"
        before = gitops.ref_commit(self.root, item.branch)
        try:
            mergeops.move_worktree_onto(worktree, tip)
        except GitError as exc:
            return f"its worktree could not be moved onto the tip: {exc.message}"
        failed = self._serve(row, request_id, tip, budget)
        after = gitops.ref_commit(self.root, item.branch)
        if failed is not None:
            return f"its fix attempt failed: {failed}"
        if after is None or after == before or not mergeops.contains(self.root, after, tip):
            return "its fix attempt left no commit on top of the new tip"
        item.head = after
        return None

    def _serve(
        self, row: dict[str, Any], request_id: int, tip: str, budget: SpendBudget | None
    ) -> str | None:
        settings = RunSettings(
            self.root,
            self.run_id,
            tip,
            default_pipeline=factory.recorded_default_pipeline(self.run, self.config),
            spend_guard_usd=budget.per_worker if budget is not None else None,
            config_file=self.config_file,
            config=self.config,
        )
        task = factory.recorded_task(row)
        executor = LocalExecutor(stop_grace_s=self.config.fleet.stop_grace)
        try:
            with ClaimStore.open(StatePaths(self.root).store_db) as claims:
                server = factory.server(
                    settings, self.ledger, claims, executor, lambda _: None, budget=budget
                )
                return server.serve_waiting(request_id, task)
        finally:
            executor.close()
