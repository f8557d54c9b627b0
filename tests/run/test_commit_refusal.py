"""A refused commit is the attempt's reason: the hook's first error line, not the agent's last words."""

from __future__ import annotations

import threading
from pathlib import Path

from helpers.fleet import make_attempt
from helpers.repo import StellaRunner

from stellafleet.core.status import AttemptEnd, AttemptOutcome, Stop, StopReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptState
from stellafleet.run.steps.commitrefusal import CommitRefusal
from stellafleet.state.ledger import Ledger

TYPE_CHECK = "#!/bin/sh\necho 'checking 3 files'\necho 'error TS2304: Cannot find name foo.'\nexit 2\n"
AGENTS_LAST_WORDS = AttemptEnd.failed(
    "command failed: exit status 1: Fix what it reports and run stella commit again."
)


def test_a_refused_commit_is_the_reason_a_worker_fails_with(git_repo: Path, stella: StellaRunner) -> None:
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(TYPE_CHECK)
    hook.chmod(0o755)
    ctx = make_attempt(git_repo)
    (git_repo / "a.ts").write_text("foo;\n")
    refused = stella("commit", "-m", "Add a", "a.ts", cwd=git_repo, env=ctx.to_env())
    assert refused.returncode == 1
    reason = "pre-commit hook refused: TS2304: Cannot find name foo. (exit status 2)"
    assert refused.stderr.splitlines()[0] == f"stella: error: {reason}; nothing was committed. It said:"
    attempt = AttemptState(PlanTask("t1", "add a", "add a"), threading.Event(), context=ctx)
    with Ledger.open(ctx.paths.fleet_db) as ledger:
        step = CommitRefusal(ledger)
        assert step.ended(attempt, AGENTS_LAST_WORDS).reason == reason
        stopped = AttemptEnd(AttemptOutcome.FAILED, "timed out", "timed out", Stop(StopReason.TIMED_OUT))
        assert step.ended(attempt, stopped).reason == "timed out"  # stopped: that is why it failed
    hook.write_text("#!/bin/sh\nexit 0\n")
    assert stella("commit", "-m", "Add a", "a.ts", cwd=git_repo, env=ctx.to_env()).returncode == 0
    with Ledger.open(ctx.paths.fleet_db) as ledger:  # committed after all: the refusal is no reason
        assert CommitRefusal(ledger).ended(attempt, AGENTS_LAST_WORDS) == AGENTS_LAST_WORDS
