"""`stella fleet --resume RUN`: a new run of an earlier run's plan that does only what is left."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import MergeStatus, RunStatus, TaskStatus
from stellafleet.git import gitops
from stellafleet.plan.model import Plan, PlanTask, load_plan
from stellafleet.proc.pids import pid_alive
from stellafleet.state.ledger import Ledger

# The PlanTask fields a task's row records of its plan entry
COMPARED = (
    "prompt", "title", "depends_on", "claims", "isolation", "base", "pipeline", "model", "timeout", "expands"
)  # fmt: skip


@dataclass(frozen=True)
class Resume:
    """The earlier run a new run resumes, and what of it is done."""

    run_id: str
    plan: Plan
    plan_path: Path | None
    done: frozenset[str]  # task ids the earlier run finished: they get no new attempt
    # what the earlier run's expanding tasks that count as done emitted: the new run has them too
    emitted: tuple[PlanTask, ...] = ()
    fragments: tuple[tuple[str, str], ...] = ()  # (done expanding task, the fragment it wrote)
    lost: tuple[str, ...] = ()  # succeeded isolated tasks whose branch no longer holds their work


def task_changes(recorded: Sequence[Mapping[str, Any]], plan: Plan) -> dict[str, list[str]]:
    """Task id -> what differs between the earlier run's recorded tasks and the plan now."""
    changes: dict[str, list[str]] = {}
    before = {row["id"]: recorded_task(row) for row in recorded if not row.get("parent_id")}
    for task in plan.tasks:
        earlier = before.get(task.id)
        if earlier is None:
            changes[task.id] = ["added"]
            continue
        differ = [field for field in COMPARED if getattr(earlier, field) != getattr(task, field)]
        if differ:
            changes[task.id] = differ
    for task_id in before:
        if task_id not in plan.ids:
            changes[task_id] = ["removed"]
    return changes


def recorded_task(row: Mapping[str, Any]) -> PlanTask:
    return PlanTask(
        id=row["id"],
        prompt=row["prompt"],
        title=row["title"],
        depends_on=tuple(row.get("depends_on") or ()),
        claims=tuple(row.get("claims") or ()),
        isolation=row.get("isolation") or "shared",
        base=row.get("base") or "pinned",
        pipeline=row.get("pipeline"),
        model=row.get("model"),
        timeout=row.get("timeout_s"),
        expands=bool(row.get("expands")),
        parent=row.get("parent_id"),
        check=row.get("check_command"),
        check_timeout=row.get("check_timeout_s") or 600.0,
    )


def kept_emitted(
    plan: Plan,
    rows: Sequence[Mapping[str, Any]],
    statuses: Mapping[str, str],
    changed: Mapping[str, list[str]],
) -> tuple[tuple[PlanTask, ...], frozenset[str]]:
    """What the earlier run's done expanding tasks emitted (a resume keeps it), and which tasks are done."""
    emitted = [recorded_task(row) for row in rows if row.get("parent_id")]
    whole = Plan(tasks=plan.tasks + tuple(task for task in emitted if task.id not in plan.ids))
    done: set[str] = set()  # succeeded before, unchanged, and every dependency done too
    for task_id in itertools.chain(*whole.waves(max(len(whole.tasks), 1))):  # dependencies first
        if (
            statuses.get(task_id) == TaskStatus.SUCCEEDED
            and task_id not in changed
            and all(dep in done for dep in whole.task(task_id).depends_on)
        ):
            done.add(task_id)
    kept: list[PlanTask] = []
    keeps = set(plan.ids)
    for task in emitted:  # recorded in the order they were emitted: a parent comes before its tasks
        if task.parent in keeps and task.parent in done:
            kept.append(task)
            keeps.add(task.id)
    return tuple(kept), frozenset(task_id for task_id in done if task_id in keeps)


def lost_work(root: Path, record: Mapping[str, Any]) -> list[str]:
    """The succeeded isolated tasks whose work is neither on their branch nor landed: not done."""
    commits: dict[str, list[str]] = {}
    for row in record["commits"]:
        commits.setdefault(str(row["task_id"]), []).append(str(row["sha"]))
    landed = {row["branch"] for row in record.get("merges", []) if row["status"] == MergeStatus.MERGED}
    lost = []
    for task in record["tasks"]:
        branch = task.get("branch")
        if task["status"] != TaskStatus.SUCCEEDED or task.get("isolation") != "isolated" or not branch:
            continue
        shas = commits.get(task["id"], [])
        if branch in landed or _holds(root, f"refs/heads/{branch}", shas):
            continue
        if not shas or not _holds(root, "HEAD", shas):
            lost.append(str(task["id"]))
    return lost


def _holds(root: Path, ref: str, shas: list[str]) -> bool:
    head = gitops.ref_commit(root, ref)
    return head is not None and all(gitops.is_ancestor(root, sha, head) for sha in shas)


def load_resume(root: Path, ref: str, *, plan_path: str | None, force: bool) -> Resume:
    """The earlier run named by ref (`latest`, an id or a unique prefix) and its re-read, checked plan."""
    fleet_db = StatePaths(root).fleet_db
    if not fleet_db.exists():
        raise StellaError(f"nothing to resume: no fleet runs recorded yet (no ledger at {fleet_db})")
    with Ledger.open(fleet_db, readonly=True) as ledger:
        record = ledger.get_run(ledger.runs.resolve(ref))
        if not force:  # checked again as the new run's row is written, in one transaction
            ledger.runs.check_resumable(record["run"]["id"])
    run = record["run"]
    if run["status"] == RunStatus.RUNNING and pid_alive(run.get("pid"), run.get("created_at_ms")):
        raise StellaError(f"run {run['id']} is still running: resume it once it has ended")
    source = plan_path or run.get("plan_path")
    if source is not None and not Path(source).exists():
        raise StellaError(
            f"cannot resume run {run['id']}: its plan {source} is gone; give it with --plan FILE"
        )
    if source is not None:
        plan = load_plan(source, root=root)
    else:  # inline prompts: the recorded tasks are the plan
        plan = Plan(tasks=tuple(recorded_task(row) for row in record["tasks"] if not row.get("parent_id")))
    changes = task_changes(record["tasks"], plan)
    described = tuple(f"task {task_id!r}: {', '.join(what)}" for task_id, what in changes.items())
    if changes and not force:
        raise StellaError(
            f"the plan changed since run {run['id']}: {'; '.join(described)}; "
            "run with --force to resume it anyway (changed tasks run again)"
        )
    statuses = {row["id"]: row["status"] for row in record["tasks"]}
    lost = lost_work(root, record)
    statuses.update(dict.fromkeys(lost, TaskStatus.FAILED))  # their only work product is gone: they run again
    emitted, done = kept_emitted(plan, record["tasks"], statuses, changes)
    fragments = tuple(
        (row["id"], row["fragment_path"])
        for row in record["tasks"]
        if row.get("fragment_path") and row["id"] in done
    )
    return Resume(
        run_id=run["id"],
        plan=plan,
        plan_path=Path(source).resolve() if source is not None else None,
        done=done,
        emitted=emitted,
        fragments=fragments,
        lost=tuple(lost),
    )


def record_lineage(ledger: Ledger, run_id: str, schedule: str, resume: Resume | None) -> None:
    """The new run's schedule and the run it resumes; the tasks done before are marked succeeded."""
    ledger.runs.set_lineage(run_id, schedule=schedule, resumed_from=resume.run_id if resume else None)
    if resume is not None:
        ledger.tasks.add(run_id, resume.emitted, {})
        for task_id, fragment_path in resume.fragments:
            ledger.tasks.set_fragment(run_id, task_id, fragment_path)
        before = {
            task["id"]: str(task.get("reason") or "") for task in ledger.get_run(resume.run_id)["tasks"]
        }
        for task_id in sorted(resume.done):
            carried = before.get(task_id, "").startswith("succeeded in run ")  # done further back
            reason = before[task_id] if carried else f"succeeded in run {resume.run_id}"
            ledger.tasks.set_status(run_id, task_id, TaskStatus.SUCCEEDED, reason)


def schedule_note(schedule: str, resume: Resume | None) -> str:
    """What the run's first line adds about its schedule and the run it resumes."""
    note = ", eager schedule" if schedule == "eager" else ""
    if resume is not None:
        total = len(resume.plan.tasks) + len(resume.emitted)
        note += f"; resumes {resume.run_id} ({len(resume.done)} of {total} tasks done)"
        if resume.lost:
            note += f"; {', '.join(resume.lost)} run again: the branch no longer holds the work"
    return note
