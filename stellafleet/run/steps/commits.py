"""Branch commits: an isolated attempt's commits on its branch, recorded in the ledger as it ends."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.state.ledger import Ledger


class BranchCommits(AttemptStep):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        if ctx.branch is None:
            return end
        # a stacked start's commits are its parents' work, not the task's
        own_since = (
            ctx.start_commit if attempt.task.base == "parents" and ctx.start_commit else ctx.base_commit
        )
        own = gitops.commits_between(ctx.root, own_since, ctx.branch)
        self.ledger.commits.record(
            own, run_id=ctx.run_id, task_id=ctx.task_id, attempt_id=ctx.attempt_id, branch=ctx.branch
        )
        return end
