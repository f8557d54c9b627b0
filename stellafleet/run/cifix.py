"""--fix-ci: the fleet's side of a red branch (docs/watch.md): each round a `ci-fix` request of its task,
served by the run's request server: an attempt in the ledger, under the run's spend limit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stellafleet.ci.watch import FixOutcome, FixRequest, watch_run
from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_OK
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import SpendBudget
from stellafleet.core.status import FollowUpReason, RunStatus
from stellafleet.git import gitops
from stellafleet.run.executor import Executor, LocalExecutor
from stellafleet.run.prepare import Prepared
from stellafleet.run.restack import restack_children
from stellafleet.run.serve import Server
from stellafleet.run.steps import FollowUp, RunSettings, factory
from stellafleet.run.steps.spend import spend_budget
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger


def fix_context(request: FixRequest) -> str:
    """What a fix-up round's prompt carries after the task's own: what CI said about its branch's work."""
    return (
        f"Your earlier work on this task is committed on branch {request.branch} "
        f"(head {request.head_sha[:12]}), and its CI failed ({request.reason}). This is fix-up round "
        f"{request.round} of at most {request.max_rounds}. Find the cause in the failing jobs' log below, "
        "fix it in this worktree and commit the fix; keep the task's intent.\n\n"
        f"Failing jobs' log (its end):\n```\n{request.failure}\n```\n"
    )


class CiFixRounds:
    """The CiFixer the watch calls: each round a `ci-fix` request of the task, served by the run's server."""

    def __init__(self, server: Server, budget: SpendBudget | None, *, max_rounds: int) -> None:
        self.server = server
        self.ledger = server.ledger
        self.budget = budget  # the run's spend limit, as its dispatcher's guards
        self.run_id = server.run_id
        self.root = server.dispatcher.settings.root
        self.max_rounds = max_rounds

    def fix(self, request: FixRequest) -> FixOutcome:
        spent = self.ledger.spend.of_run(self.run_id)
        reached = self.budget.reached(spent) if self.budget is not None else None
        if reached is not None:
            return FixOutcome(None, reached + "; no fix-up attempt")
        row = next(t for t in self.ledger.get_run(self.run_id)["tasks"] if t["id"] == request.task_id)
        if not row.get("worktree") or not Path(row["worktree"]).is_dir():
            return FixOutcome(None, "the task's worktree is gone (cleaned up?): no fix-up attempt")
        task = factory.recorded_task(row, with_check=False)
        before = gitops.ref_commit(self.root, request.branch)
        follow_up = FollowUp(FollowUpReason.CI_FIX, fix_context(request))
        asked = self.server.ask(task.id, follow_up, asked_by="watch", branch=request.branch)
        failed = self.server.serve_waiting(asked, task)
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
        restacked = restack_children(
            self.server.dispatcher.settings, self.ledger, request.task_id, before or after
        )
        note = "".join(f"; {line}" for line in restacked)
        return FixOutcome(after, f"fix-up {attempt} committed {after[:12]}; pushed to be watched again{note}")


def watch_after_run(
    p: Prepared, ledger: Ledger, claims: ClaimStore, executor: Executor, status: RunStatus, code: int
) -> tuple[Any, int]:
    """`stella fleet --watch` once the run ended: its branches followed through CI (with --fix-ci N, red
    ones go back to their task on the run's own claims and executor); the watch's document and the exit
    code, which the watch may turn from 0 to its own."""
    fixer = None
    if p.options.fix_ci:  # --fix-ci N: follow-up rounds per red branch (the parser wants --watch)
        # the fix-ups' guards come out of what the run's workers left of the limit
        budget = spend_budget(
            p.spend_limit, p.concurrency.value, p.config, spent=ledger.spend.of_run(p.run_id)
        )
        server = factory.server(p.run_settings(), ledger, claims, executor, lambda event: None, budget=budget)
        fixer = CiFixRounds(server, budget, max_rounds=p.options.fix_ci)
    result = watch_run(p.root, p.run_id, config=p.config, json_mode=p.options.json_mode, fixer=fixer)
    if code == EXIT_OK and result.exit_code != EXIT_OK:
        code = result.exit_code
        ledger.runs.finish(
            p.run_id, status, exit_code=code, reason="watch: a watched branch did not end green"
        )
    return result.to_json(), code


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
            server = factory.server(settings, ledger, claims, executor, lambda _: None, budget=budget)
            yield CiFixRounds(server, budget, max_rounds=max_rounds)
        finally:
            executor.close()
