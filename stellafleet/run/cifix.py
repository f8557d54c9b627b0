"""--fix-ci: the fleet's side of a red branch (docs/watch.md): one follow-up attempt of its task per round,
through the run's Dispatcher: an attempt in the ledger, under the run's spend limit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from stellafleet.ci.watch import FixOutcome, FixRequest
from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import SpendBudget
from stellafleet.git import gitops
from stellafleet.plan.model import PlanTask
from stellafleet.run.background import run_in_background
from stellafleet.run.dispatch import Dispatcher, TaskFailed
from stellafleet.run.events import SkipTask
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.restack import restack_children
from stellafleet.run.steps import RunSettings, factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

CI_FIX_REASON = "ci-fix"


def execute_in_background(dispatcher: Dispatcher, task: PlanTask, *, reason: str | None = None) -> str | None:
    """dispatcher.execute(task) in the background: Ctrl-C here stops the worker and lets the attempt be
    recorded before it is raised on. Returns why the task failed, or None."""
    try:
        run_in_background(
            lambda: dispatcher.execute(task, reason=reason),
            on_interrupt=dispatcher.stop_workers,
            name=f"stella-{task.id}",
        )
    except (TaskFailed, SkipTask) as failed:  # SkipTask: too little of the spend limit is left
        return str(failed)
    return None


def fix_prompt(prompt: str, request: FixRequest) -> str:
    """The task's own prompt, then what CI said about the work on its branch."""
    return (
        f"{prompt.rstrip()}\n\n"
        f"---\nYour earlier work on this task is committed on branch {request.branch} "
        f"(head {request.head_sha[:12]}), and its CI failed ({request.reason}). This is fix-up round "
        f"{request.round} of at most {request.max_rounds}. Find the cause in the failing jobs' log below, "
        "fix it in this worktree and commit the fix; keep the task's intent.\n\n"
        f"Failing jobs' log (its end):\n```\n{request.failure}\n```\n"
    )


class CiFixRounds:
    """The CiFixer the watch calls: one follow-up attempt per round, on the run's Dispatcher."""

    def __init__(
        self, dispatcher: Dispatcher, ledger: Ledger, budget: SpendBudget | None, *, max_rounds: int
    ) -> None:
        self.dispatcher = dispatcher
        self.ledger = ledger
        self.budget = budget  # the run's spend limit, as its dispatcher's guards
        self.run_id = dispatcher.settings.run_id
        self.root = dispatcher.settings.root
        self.max_rounds = max_rounds

    def fix(self, request: FixRequest) -> FixOutcome:
        spent = self.ledger.spend.of_run(self.run_id)
        reached = self.budget.reached(spent) if self.budget is not None else None
        if reached is not None:
            return FixOutcome(None, reached + "; no fix-up attempt")
        row = next(t for t in self.ledger.get_run(self.run_id)["tasks"] if t["id"] == request.task_id)
        if not row.get("worktree") or not Path(row["worktree"]).is_dir():
            return FixOutcome(None, "the task's worktree is gone (cleaned up?): no fix-up attempt")
        task = PlanTask(
            id=row["id"],
            prompt=fix_prompt(row.get("prompt") or "", request),
            title=row.get("title") or row["id"],
            isolation="isolated",
            pipeline=row.get("pipeline"),
            model=row.get("model"),
            timeout=row.get("timeout_s"),
        )
        before = gitops.ref_commit(self.root, request.branch)
        failed = execute_in_background(self.dispatcher, task, reason=CI_FIX_REASON)
        ids = [
            a["id"] for a in self.ledger.get_run(self.run_id)["attempts"] if a["task_id"] == request.task_id
        ]
        attempt = f"attempt {len(ids)}"  # the task's own count, as `stella runs` shows it
        after = gitops.ref_commit(self.root, request.branch)
        if failed is not None:
            return FixOutcome(None, f"fix-up {attempt} failed: {failed}")
        if after is None or after == before:
            return FixOutcome(None, f"fix-up {attempt} made no new commit")
        # the tasks stacked on the old head go stale, and are replayed onto the new one where they can be
        restacked = restack_children(self.dispatcher.settings, self.ledger, request.task_id, before or after)
        note = "".join(f"; {line}" for line in restacked)
        return FixOutcome(after, f"fix-up {attempt} committed {after[:12]}; pushed to be watched again{note}")


@contextlib.contextmanager
def fixer_for_past_run(
    root: Path,
    run_id: str,
    config: Config,
    *,
    max_rounds: int,
    spend_limit: float | None,
    config_file: Path | None = None,
) -> Iterator[CiFixRounds]:
    """A CiFixRounds for `stella watch --fix-ci`: the run's settings read back from the ledger; the spend
    limit is the one given now, else the run's, less what the run spent."""
    paths = StatePaths(root)
    with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as claims:
        run = ledger.get_run(run_id)["run"]
        limit = spend_limit if spend_limit is not None else run.get("spend_limit_usd")
        concurrency = max(1, int(run.get("max_concurrency") or 1))
        budget = spend_budget(limit, concurrency, config, spent=ledger.spend.of_run(run_id))
        settings = RunSettings(
            root,
            run_id,
            run["base_commit"],
            default_pipeline=factory.recorded_default_pipeline(run, config),
            spend_guard_usd=budget.per_worker if budget is not None else None,
            config_file=config_file.resolve() if config_file else None,
            config=config,
        )
        executor = LocalExecutor(stop_grace_s=config.fleet.stop_grace)
        try:
            # a past run's fix-up attempts tell their story through the watch's own lines, not the fleet's
            dispatcher = factory.dispatcher(settings, ledger, claims, executor, lambda _: None, budget=budget)
            yield CiFixRounds(dispatcher, ledger, budget, max_rounds=max_rounds)
        finally:
            executor.close()
