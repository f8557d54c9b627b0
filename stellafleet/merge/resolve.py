"""`stella merge --resolve`: a conflicting branch handed to a worker as a task of its own (docs/merge.md),
under what the run has left of its spend limit; its result is checked like every other branch's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import SpendBudget, money
from stellafleet.core.status import FollowUpReason
from stellafleet.git import gitops, mergeops
from stellafleet.merge.journal import Journal
from stellafleet.merge.queue import RESOLVE_TITLE, MergeItem
from stellafleet.plan.model import PlanTask
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.serve import Server
from stellafleet.run.steps import FollowUp, RunSettings, factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

CONFLICT_BYTES = 12_000  # how much of the conflict's diff a prompt carries (its start: the first hunks)


@dataclass(frozen=True)
class Resolution:
    head: str | None  # the resolved commit on the resolve branch, or None
    note: str


def resolve_prompt(item: MergeItem, onto: str, files: tuple[str, ...], prompt: str) -> str:
    """The resolve task's own prompt; its request carries the conflict (conflict_context)."""
    return (
        f"Branch {item.branch} (task {item.task_id}) conflicts with {onto}; this worktree is {onto}'s "
        f"tip. Merge the branch here (`git merge --no-ff {item.head}`), resolve the conflicts in "
        f"{', '.join(files)} so both sides' intent survives, and commit the merge.\n\n"
        f"The task the branch did:\n{prompt.strip()}\n"
    )


def conflict_context(diff: str) -> str:
    shown = diff if len(diff) <= CONFLICT_BYTES else diff[:CONFLICT_BYTES] + "\n[... the rest left out ...]"
    return f"The conflict, as git shows it:\n```diff\n{shown.rstrip()}\n```\n"


class Resolver:
    """Runs resolve tasks for one run; opened once per `stella merge --resolve`."""

    def __init__(
        self,
        root: Path,
        ledger: Ledger,
        run_id: str,
        config: Config,
        spend_limit: float | None,
        config_file: Path | None = None,  # the global --config, handed to the worker too
    ) -> None:
        self.root = root
        self.ledger = ledger
        self.run_id = run_id
        self.config = config
        self.config_file = config_file.resolve() if config_file else None
        record = ledger.get_run(run_id)
        self.run = record["run"]
        self.prompts = {t["id"]: t.get("prompt") or "" for t in record["tasks"]}
        self.limit = spend_limit if spend_limit is not None else self.run.get("spend_limit_usd")

    def _server(
        self, tip: str, claims: ClaimStore, executor: LocalExecutor, budget: SpendBudget | None
    ) -> Server:
        settings = RunSettings(
            self.root,
            self.run_id,
            tip,  # the resolve task's worktree starts at the current tip
            default_pipeline=factory.recorded_default_pipeline(self.run, self.config),
            config_file=self.config_file,
            config=self.config,
        )
        # the resolve task tells its story through stella merge's own lines
        return factory.server(settings, self.ledger, claims, executor, lambda event: None, budget=budget)

    def resolve(
        self, item: MergeItem, onto: str, tip: str, files: tuple[str, ...], diff: str, journal: Journal
    ) -> Resolution:
        # The worker's guard is what the run has left of its limit, as for the run's own workers.
        spent = self.ledger.spend.of_run(self.run_id)
        budget = spend_budget(self.limit, 1, self.config, spent=spent)
        if budget is not None and budget.reached(spent):
            return Resolution(
                None, f"spend limit reached ({money(spent)} of {money(budget.limit)}): not handed on"
            )
        task_id = self._free_id(f"resolve-{item.task_id}")
        prompt = resolve_prompt(item, onto, files, self.prompts.get(item.task_id, ""))
        task = PlanTask(
            task_id, prompt, RESOLVE_TITLE.format(branch=item.branch, onto=onto), isolation="isolated"
        )
        self.ledger.tasks.add(self.run_id, [task], {})
        # A merge killed from here on leaves the task running: the next stella command finishes it.
        journal.note(resolving={"run_id": self.run_id, "task_id": task_id, "tip": tip})
        paths = StatePaths(self.root)
        executor = LocalExecutor(stop_grace_s=self.config.fleet.stop_grace)
        try:
            with ClaimStore.open(paths.store_db) as claims:
                server = self._server(tip, claims, executor, budget)
                follow_up = FollowUp(FollowUpReason.RESOLVE, conflict_context(diff), start_at=tip)
                asked = server.ask(task_id, follow_up, asked_by="stella merge", branch=item.branch)
                failed = server.serve_waiting(asked, task)
        finally:
            executor.close()
        journal.note(resolving=None)  # ended (not on Ctrl-C: then the merge's own clean-up finishes it)
        if failed is not None:
            return Resolution(None, f"resolve task {task_id} failed: {failed}")
        branch = next(t["branch"] for t in self.ledger.get_run(self.run_id)["tasks"] if t["id"] == task_id)
        head = gitops.ref_commit(self.root, branch) if branch else None
        if head is None or head == tip or not gitops.is_ancestor(self.root, tip, head):
            return Resolution(None, f"resolve task {task_id} left no commit on top of {onto}")
        if item.head is None or not mergeops.contains(self.root, head, item.head):
            return Resolution(
                None,
                f"resolve task {task_id} committed {head[:12]} on {branch} but never merged {item.branch} "
                f"(its head {(item.head or '?')[:12]} is not in it): not landed",
            )
        return Resolution(head, f"conflict resolved by task {task_id} on {branch}")

    def _free_id(self, wanted: str) -> str:
        taken = {t["id"] for t in self.ledger.get_run(self.run_id)["tasks"]}
        n, candidate = 1, wanted
        while candidate in taken:
            n += 1
            candidate = f"{wanted}-{n}"
        return candidate
