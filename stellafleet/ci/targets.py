"""Which branches of a run hold successful work, and so are worth pushing and watching through CI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stellafleet.core.status import AttemptOutcome, TaskStatus


@dataclass(frozen=True)
class TaskWork:
    id: str
    title: str
    summary: str
    spend_usd: float
    commits: tuple[tuple[str, str], ...]  # (sha, message), oldest first


@dataclass(frozen=True)
class Target:
    branch: str
    kind: str  # "isolated" | "shared"
    tasks: tuple[TaskWork, ...]

    @property
    def task_id(self) -> str | None:
        return self.tasks[0].id if len(self.tasks) == 1 else None

    def title(self, run_id: str) -> str:
        if len(self.tasks) == 1:
            return self.tasks[0].title
        return f"stella fleet {run_id}: {len(self.tasks)} tasks"


def branches_to_watch(run: dict[str, Any]) -> list[Target]:
    """Branches of succeeded isolated tasks with commits, then branches that succeeded shared tasks used."""
    commits = run["commits"]
    attempts = run["attempts"]

    def work(task: dict[str, Any], on_branch: str | None) -> TaskWork:
        own = [c for c in attempts if c["task_id"] == task["id"]]
        done = [a for a in own if a.get("outcome") == AttemptOutcome.SUCCEEDED or a.get("success") == 1]
        summary = (done[-1].get("summary") if done else None) or ""
        task_commits = tuple(
            (c["sha"], c["message"] or "")
            for c in commits
            if c["task_id"] == task["id"] and (on_branch is None or c["branch"] == on_branch)
        )
        return TaskWork(
            task["id"],
            task["title"] or task["id"],
            summary.strip(),
            float(sum(a.get("spend_usd") or 0.0 for a in own)),
            task_commits,
        )

    targets: list[Target] = []
    shared: dict[str, list[TaskWork]] = {}
    for task in run["tasks"]:
        if task["status"] != TaskStatus.SUCCEEDED:
            continue
        if task["isolation"] == "isolated":
            item = work(task, None)
            if task["branch"] and item.commits:
                targets.append(Target(task["branch"], "isolated", (item,)))
            continue
        for branch in dict.fromkeys(
            c["branch"] for c in commits if c["task_id"] == task["id"] and c["branch"]
        ):
            shared.setdefault(branch, []).append(work(task, branch))
    targets.extend(Target(branch, "shared", tuple(items)) for branch, items in shared.items())
    return targets
