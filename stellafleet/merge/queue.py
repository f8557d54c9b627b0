"""Which of a run's branches `stella merge` takes, and in what order: dependencies first (docs/merge.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stellafleet.core.status import CIState, MergeStatus, TaskStatus

BRANCH_PREFIX = "fleet/"
# The title of a `stella merge --resolve` task (resolve.py), by which plan_queue knows one.
RESOLVE_TITLE = "resolve {branch} onto {onto}"
_RESOLVE_TITLE = re.compile(r"resolve (fleet/\S+) onto \S+")


@dataclass
class MergeItem:
    """One branch's way through the queue; status starts `planned` and ends as what happened."""

    branch: str
    task_id: str
    position: int
    after: tuple[str, ...]  # task ids of earlier queue items this one depends on
    status: MergeStatus = MergeStatus.PLANNED
    reason: str = ""
    head: str | None = None  # the branch's commit when the queue took it
    before_sha: str | None = None
    after_sha: str | None = None
    files: list[str] = field(default_factory=list)
    check_tail: str = ""
    check: str | None = None  # the task's own check, run again on the integrated tree before it lands
    check_timeout: float = 600.0
    start: str | None = None  # a stacked task's recorded start: its parents' work, which lands before it
    claims: tuple[str, ...] = ()  # the plan's claims: a batch takes only branches disjoint in these too
    batch: int | None = None  # the number of the train's batch it landed or was evicted in
    merge_id: int | None = None  # its row of the ledger's merges in the current batch

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "branch": self.branch,
            "task_id": self.task_id,
            "depends_on": list(self.after),
            "status": str(self.status),
            "reason": self.reason,
            "head": self.head,
            "before_sha": self.before_sha,
            "after_sha": self.after_sha,
            "files": list(self.files),
            "check_tail": self.check_tail,
            "batch": self.batch,
        }


def _not_taken(ci: dict[str, Any] | None, unwatched: bool, tip: str | None) -> str | None:
    """Why a succeeded task's branch (at tip, when known) is left out of the queue; None: it goes in."""
    if unwatched:
        return None
    if ci is None:
        return "CI never watched this branch (watch it with `stella watch`, or merge with --unwatched)"
    if ci.get("state") != CIState.GREEN:
        why = f" ({ci['reason']})" if ci.get("reason") else ""
        return f"CI is {ci.get('state')}, not green{why}"
    passed = ci.get("head_sha") or ""
    if tip and passed != tip:  # green counts for the commit CI ran on (a restack or a later commit moves it)
        return f"CI passed on {passed[:7] or 'no recorded commit'}, not on the tip {tip[:7]}: watch it again"
    return None


def _stale(task: dict[str, Any]) -> str | None:
    """Why a stacked task's branch does not hold its parents' work as it is now (a restack left it)."""
    if not task.get("stale"):
        return None
    return f"stale: {task['stale']}, its branch was not restacked onto that (`stella runs` says why)"


def resolved_branch(task: dict[str, Any]) -> str | None:
    """The branch a resolve task was made for (it has no wave: it is not the plan's), else None."""
    if task.get("wave") is not None or not str(task["id"]).startswith("resolve-"):
        return None
    found = _RESOLVE_TITLE.fullmatch(task.get("title") or "")
    return found.group(1) if found else None


def _depends(tasks: dict[str, dict[str, Any]], task_id: str, wanted: set[str]) -> set[str]:
    """The tasks of `wanted` that task_id depends on, directly or through tasks outside it."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = list(tasks[task_id].get("depends_on") or [])
    while stack:
        dep = stack.pop()
        if dep in seen or dep not in tasks:
            continue
        seen.add(dep)
        if dep in wanted:
            found.add(dep)
        stack.extend(tasks[dep].get("depends_on") or [])
    return found


CARRIED = "succeeded in run "  # the reason a resumed run records for a task done before it (run/resume.py)


def plan_queue(
    run: dict[str, Any], *, unwatched: bool, tips: Mapping[str, str] | None = None
) -> tuple[list[MergeItem], list[MergeItem]]:
    """(the queue in merge order, the branches left out with why) for a run record from Ledger.get_run;
    with tips (branch -> its commit now), a green branch whose tip is not where CI passed is left out."""
    tasks = {task["id"]: task for task in run["tasks"]}
    ci = {entry["branch"]: entry for entry in run["ci"]}
    order = {task_id: index for index, task_id in enumerate(tasks)}
    chosen: list[dict[str, Any]] = []
    left_out: list[MergeItem] = []
    for task in run["tasks"]:
        branch = task.get("branch") or ""
        earlier = str(task.get("reason") or "")
        if task["status"] == TaskStatus.SUCCEEDED and not branch and earlier.startswith(CARRIED):
            # a resumed run's task done before it: its branch is that run's
            landing = (
                f"{earlier}: its branch lands with that run (`stella merge {earlier.removeprefix(CARRIED)}`)"
            )
            left_out.append(MergeItem("", task["id"], 0, (), MergeStatus.SKIPPED, landing))
            continue
        if task["status"] != TaskStatus.SUCCEEDED or not branch.startswith(BRANCH_PREFIX):
            continue
        # a resolve task's work lands only as the resolution of its branch, checked with it: on its own
        # it would land unchecked work
        resolves = resolved_branch(task)
        why = (
            f"a resolve task's branch: it lands only as the resolution of {resolves} (stella merge --resolve)"
            if resolves
            else _stale(task) or _not_taken(ci.get(branch), unwatched, (tips or {}).get(branch))
        )
        if why is None:
            chosen.append(task)
        else:
            left_out.append(MergeItem(branch, task["id"], 0, (), MergeStatus.SKIPPED, why))
    starts = {a["task_id"]: a["start_commit"] for a in run.get("attempts", ()) if a.get("start_commit")}
    wanted = {task["id"] for task in chosen}
    deps = {task["id"]: _depends(tasks, task["id"], wanted) for task in chosen}
    queue: list[MergeItem] = []
    placed: set[str] = set()
    pending = sorted(chosen, key=lambda t: (t.get("wave") is None, t.get("wave") or 0, order[t["id"]]))
    while pending:
        ready = next((t for t in pending if deps[t["id"]] <= placed), pending[0])  # a cycle cannot happen
        pending.remove(ready)
        placed.add(ready["id"])
        after = tuple(sorted(deps[ready["id"]], key=order.__getitem__))
        item = MergeItem(ready["branch"], ready["id"], len(queue) + 1, after)
        item.check, item.check_timeout = ready.get("check_command"), ready.get("check_timeout_s") or 600.0
        item.start = starts.get(ready["id"])
        item.claims = tuple(ready.get("claims") or ())
        queue.append(item)
    return queue, left_out
