"""Branch commits: an isolated attempt's commits on its branch, recorded in the ledger as it ends; and
`[fleet] require_commits`: a task that succeeded without a commit fails."""

from __future__ import annotations

from dataclasses import replace

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.git import gitops
from stellafleet.run.steps import AttemptState, AttemptStep
from stellafleet.state.ledger import Ledger

NO_COMMIT = "succeeded without a commit ([fleet] require_commits)"


def own_commits(attempt: AttemptState) -> list[gitops.CommitInfo]:
    """An isolated task's own commits on its branch (a stacked start's are its parents' work)."""
    ctx = attempt.ctx
    assert ctx.branch is not None
    own_since = ctx.start_commit if attempt.task.base == "parents" and ctx.start_commit else ctx.base_commit
    return gitops.commits_between(ctx.root, own_since, ctx.branch)


class RequiredCommits(AttemptStep):
    """`[fleet] require_commits`: a succeeded attempt whose task has no commit fails (before salvage, which
    then keeps what it left uncommitted)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        if end.outcome != AttemptOutcome.SUCCEEDED:
            return end
        made = (
            own_commits(attempt)
            if ctx.branch is not None
            else self.ledger.commits.of_task(ctx.run_id, ctx.task_id)
        )
        if made:
            return end
        summary = f"{end.summary}; {NO_COMMIT}" if end.summary else NO_COMMIT
        return replace(end, outcome=AttemptOutcome.FAILED, summary=summary, error=NO_COMMIT)


class BranchCommits(AttemptStep):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        ctx = attempt.ctx
        if ctx.branch is None:
            return end
        self.ledger.commits.record(
            own_commits(attempt),
            run_id=ctx.run_id,
            task_id=ctx.task_id,
            attempt_id=ctx.attempt_id,
            branch=ctx.branch,
        )
        return end
