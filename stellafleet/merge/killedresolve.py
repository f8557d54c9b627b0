"""The repair of a `stella merge --resolve` killed while its resolve task ran (docs/merge.md).

The worker's group is stopped and its work salvaged before the worktree goes; a worktree whose work could
not be salvaged is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.core.errors import GitError, StellaError
from stellafleet.core.status import AttemptEnd, AttemptOutcome, TaskStatus
from stellafleet.git import gitops, worktrees
from stellafleet.git.clean import uncommitted
from stellafleet.proc.group import group_exists, stop_group
from stellafleet.proc.pids import pid_alive, pid_alive_since
from stellafleet.run.salvaging import salvage_attempt
from stellafleet.state.ledger import Ledger

STOP_GRACE_S = 2.0
REASON = "stella merge --resolve was killed while this resolve task ran: its attempt was abandoned"


def _stop_worker(attempt: dict[str, Any]) -> bool:
    """Stop the attempt's worker and whatever is left in its process group (a worker runs in a session of
    its own: its group is its pid); whether anything was running."""
    pid = attempt.get("pid")
    if pid is None:
        return False
    # The leader gone (or a zombie) but its group still there: the worker's own children, which outlived
    # it (a new process given the same pid would lead a group of that pid, and is alive: pid_alive tells).
    leftovers = group_exists(int(pid)) and not pid_alive_since(int(pid), None, tolerance_s=0.0)
    if not (pid_alive(int(pid), attempt.get("started_at_ms")) or leftovers):
        return False
    stop_group(int(pid), STOP_GRACE_S)
    return True


def _abandon(root: Path, ledger: Ledger, run_id: str, task_id: str, attempt: dict[str, Any]) -> list[str]:
    done = [f"its worker (pid {attempt['pid']}) stopped"] if _stop_worker(attempt) else []
    attempt_id = int(attempt["id"])
    worktree = Path(attempt["worktree"]) if attempt.get("worktree") else None
    saved = salvage_attempt(
        ledger,
        root=root,
        run_id=run_id,
        task_id=task_id,
        attempt_id=attempt_id,
        worktree=worktree,
        claimed=[],
        outcome=str(AttemptOutcome.ABANDONED),
    )
    if saved is not None:
        attempt["salvage_sha"] = saved.sha
        done.append(f"its uncommitted work salvaged as {saved.ref}")
    ledger.attempts.finish(attempt_id, AttemptEnd(AttemptOutcome.ABANDONED, REASON, REASON))
    return done


def _drop_workspace(root: Path, attempt: dict[str, Any], tip: str | None) -> list[str]:
    """Remove the resolve task's worktree (unless it holds work no salvage kept) and its branch when it
    has nothing beyond tip."""
    done: list[str] = []
    path = Path(attempt["worktree"]) if attempt.get("worktree") else None
    if path is not None and path.is_dir():
        if uncommitted(path) and not attempt.get("salvage_sha"):
            return [f"its worktree {path} kept: it holds uncommitted work"]
        worktrees.worktree_remove(root, path, force=True)
        done.append("its worktree removed")
    gitops.git("worktree", "prune", cwd=root, check=False)
    branch = attempt.get("branch")
    if branch and tip and gitops.ref_commit(root, f"refs/heads/{branch}") == tip:
        gitops.branch_delete(root, branch)
        done.append(f"its empty branch {branch} deleted")
    return done


def finish(root: Path, ledger: Ledger, noted: dict[str, Any]) -> str:
    """Finish the resolve task the journal noted; what was done, in words."""
    run_id, task_id, tip = str(noted["run_id"]), str(noted["task_id"]), noted.get("tip")
    columns = "id, task_id, outcome, pid, started_at_ms, worktree, branch, salvage_sha"
    attempts = [a for a in ledger.attempts.of_run(run_id, columns) if a["task_id"] == task_id]
    done: list[str] = []
    for attempt in attempts:
        if attempt["outcome"] == AttemptOutcome.RUNNING:
            done += _abandon(root, ledger, run_id, task_id, attempt)
    task = next((t for t in ledger.get_run(run_id)["tasks"] if t["id"] == task_id), None)
    if task is not None and task["status"] in (TaskStatus.RUNNING, TaskStatus.PENDING, "abandoned"):
        ledger.tasks.set_status(run_id, task_id, TaskStatus.INTERRUPTED, REASON)
        done.append("recorded interrupted")
    if attempts:
        try:
            done += _drop_workspace(root, attempts[-1], tip)
        except (GitError, StellaError, OSError) as exc:
            done.append(f"its worktree could not be removed ({exc}): `stella clean` removes it")
    return f"its resolve task {task_id}: {', '.join(done) or 'had already ended'}"
