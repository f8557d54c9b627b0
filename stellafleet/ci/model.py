"""What the watch is made of: the branches of a run that hold successful work, one watched branch, the
result of a watch, and where its events go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stellafleet.ci.gh import CiRun
from stellafleet.core.errors import EXIT_OK, EXIT_WATCH_RED
from stellafleet.core.spend import money
from stellafleet.core.status import AttemptOutcome, CIState, TaskStatus


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


@dataclass
class BranchWatch:
    """One watched branch, from push to its final CI state."""

    target: Target
    head_sha: str | None = None
    pr_url: str | None = None
    pr_number: int | None = None
    pr_body: str | None = None
    state: CIState = CIState.PENDING
    conclusion: str | None = None
    reason: str | None = None
    phase: str = "starting"
    runs: list[CiRun] = field(default_factory=list)
    since: float = 0.0
    last_change: float = 0.0
    ended_at: float | None = None
    seen: tuple[Any, ...] | None = None
    gh_trouble: str | None = None
    fix_rounds: int = 0  # --fix-ci rounds run for this branch
    fix_note: str | None = None  # why the last round left it red

    @property
    def branch(self) -> str:
        return self.target.branch

    @property
    def done(self) -> bool:
        return self.state.settled

    @property
    def run_urls(self) -> list[str]:
        return [r.url for r in self.runs if r.url]

    def to_json(self, start: float) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "kind": self.target.kind,
            "task_id": self.target.task_id,
            "tasks": [t.id for t in self.target.tasks],
            "head_sha": self.head_sha,
            "pr_number": self.pr_number,
            "pr_url": self.pr_url,
            "state": str(self.state),
            "conclusion": self.conclusion,
            "reason": self.reason,
            "run_urls": self.run_urls,
            "fix_rounds": self.fix_rounds,
            "runs": [r.to_json() for r in self.runs],
            "elapsed_s": None if self.ended_at is None else round(self.ended_at - start, 3),
        }


@dataclass
class WatchResult:
    run_id: str
    remote: str | None
    branches: list[BranchWatch]
    message: str | None = None
    start: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(b.state == CIState.GREEN for b in self.branches) else EXIT_WATCH_RED

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "remote": self.remote,
            "exit_code": self.exit_code,
            "message": self.message,
            "branches": [b.to_json(self.start) for b in self.branches],
        }


class WatchReporter(Protocol):
    """Where watch tells what happens: an event sink, so the fleet can fold it into its own output."""

    def note(self, message: str) -> None: ...

    def changed(self, watch: BranchWatch) -> None:
        """A branch's state or phase changed (called once per change)."""
        ...

    def finished(self, result: WatchResult) -> None: ...


def task_section(task: TaskWork, run_id: str) -> str:
    """One task's part of a PR body: title, summary, spend and commits."""
    listed = "\n".join(f"- `{sha[:12]}` {message}" for sha, message in task.commits) or "- (none)"
    return (
        f"## {task.title}\n\nTask `{task.id}` of stella fleet run `{run_id}`.\n\n"
        f"### Summary\n\n{task.summary or '(no summary recorded)'}\n\n"
        f"### Spend\n\n{money(task.spend_usd)}\n\n### Commits\n\n{listed}"
    )
