"""The start commit: where an isolated task's new worktree starts. With `base = "parents"` it is built
as the task is dispatched, from the pinned base and the work of all its dependencies (git/stack.py);
with --from-salvage the task's salvaged work goes on top."""

from __future__ import annotations

import dataclasses
from typing import Any

from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops, stack
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, RunSettings
from stellafleet.state.ledger import Ledger

PARENTS = "parents"


class StartCommit(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger

    def before_start(self, attempt: AttemptState) -> None:
        """The attempt's start commit set on its context; AttemptFailed when its parents' work conflicts."""
        ctx = attempt.ctx
        if ctx.branch is None or (attempt.task.base != PARENTS and attempt.follow_up):
            return
        settings = self.settings
        if attempt.follow_up:  # in the worktree its first attempt made: its own work starts where that did
            recorded = self.ledger.attempts.start_of(ctx.run_id, ctx.task_id)
            attempt.context = dataclasses.replace(ctx, start_commit=recorded)
            return
        salvaged = settings.start_points.get(ctx.task_id)
        if attempt.task.base != PARENTS:
            start = salvaged
        else:
            parts = contributions(self.settings, self.ledger, attempt.task.id)
            if salvaged is not None:  # the task's own unfinished work, last, on top of its parents'
                parts.append(stack.Contribution("its salvaged work", tip=salvaged))
            built = stack.build_start(settings.root, settings.base_commit, parts)
            if isinstance(built, stack.Conflict):
                raise AttemptFailed(AttemptEnd.failed(f"cannot start from its dependencies' work: {built}"))
            start = built
            shown = [(part.task_id, part.head) for part in parts if part.head]
            self.ledger.attempts.set_start(ctx.attempt_id, built, shown)
        if start is not None and start != settings.base_commit:
            attempt.context = dataclasses.replace(ctx, start_commit=start)
            attempt.env.update(attempt.context.to_env())


def _ancestors(task_id: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    """Every task task_id waits for (and what those emitted), each after all it waits for itself."""
    children: dict[str, list[str]] = {}
    for row in rows.values():
        if row.get("parent_id"):
            children.setdefault(row["parent_id"], []).append(row["id"])

    def waits_for(node: str) -> list[str]:
        emitted = children.get(node, []) if node != task_id else []  # its own emitted tasks wait for it
        return [*rows.get(node, {}).get("depends_on", ()), *emitted]

    order: list[str] = []
    seen = {task_id}
    walk = [(task_id, iter(waits_for(task_id)))]  # iterative: a plan's chain can be deeper than the stack
    while walk:
        node, pending = walk[-1]
        following = next((dependency for dependency in pending if dependency not in seen), None)
        if following is None:
            walk.pop()
            order.append(node)
        else:
            seen.add(following)
            walk.append((following, iter(waits_for(following))))
    return order[:-1]  # all but task_id itself, which is finished last


def contributions(settings: RunSettings, ledger: Ledger, task_id: str) -> list[stack.Contribution]:
    """Each dependency's work, transitively, dependencies before their dependents, in plan order: what a
    stacked task starts from, and what a restack replays it onto."""
    runs = ledger.runs.lineage(settings.run_id)
    listed = ledger.tasks.of_run(settings.run_id, "id, depends_on_json, parent_id")
    rows = {row["id"]: row for row in listed}
    results = [
        (dependency, ledger.tasks.succeeded_in(runs, dependency)) for dependency in _ancestors(task_id, rows)
    ]
    branches = [
        done["branch"] for _, done in results if done and done["isolation"] == "isolated" and done["branch"]
    ]
    tips = gitops.branch_tips(settings.root, branches)
    parts: list[stack.Contribution] = []
    for dependency, done in results:
        if done is None:
            continue  # an emitted task's emitter, say, that made nothing itself
        if done["isolation"] != "isolated":
            commits = tuple(ledger.commits.of_task(done["run_id"], dependency))
            parts.append(stack.Contribution(dependency, commits=commits))
            continue
        tip = tips.get(done["branch"] or "")
        if tip is None:
            raise AttemptFailed(
                AttemptEnd.failed(
                    f"cannot start from its dependencies' work: the branch {done['branch']} of "
                    f"{dependency} is gone: restore it, or resume the run once it ends to run it again"
                )
            )
        parts.append(stack.Contribution(dependency, tip=tip))
    return parts
