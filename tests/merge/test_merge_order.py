"""Which branches `stella merge` takes and in what order, from a run's ledger record."""

from __future__ import annotations

from typing import Any

from stellafleet.merge.queue import plan_queue


def task(task_id: str, *, deps: tuple[str, ...] = (), wave: int = 1, status: str = "succeeded",
         branch: str | None = "auto") -> dict[str, Any]:  # fmt: skip
    return {
        "id": task_id,
        "depends_on": list(deps),
        "wave": wave,
        "status": status,
        "branch": f"fleet/{task_id}-1" if branch == "auto" else branch,
    }


def green(*task_ids: str, state: str = "green") -> list[dict[str, Any]]:
    return [{"branch": f"fleet/{t}-1", "state": state, "reason": None} for t in task_ids]


def test_dependencies_come_first_even_through_a_task_without_a_branch() -> None:
    run = {
        "tasks": [
            task("ui", deps=("glue",), wave=1),
            task("glue", deps=("api",), wave=1, branch=None),  # a shared task: no branch of its own
            task("docs", wave=1),
            task("api", wave=2),
        ],
        "ci": green("ui", "docs", "api"),
    }
    queue, left_out = plan_queue(run, unwatched=False)
    assert [(i.task_id, i.position, i.after) for i in queue] == [
        ("docs", 1, ()),
        ("api", 2, ()),
        ("ui", 3, ("api",)),
    ]
    assert left_out == []


def test_only_green_succeeded_fleet_branches_unless_unwatched() -> None:
    run = {
        "tasks": [
            task("a"),
            task("b"),
            task("c"),
            task("d", status="failed"),
            task("e", branch="main"),
        ],
        "ci": [*green("a"), *green("b", state="red")],
    }
    queue, left_out = plan_queue(run, unwatched=False)
    assert [i.task_id for i in queue] == ["a"]
    assert {i.task_id: i.reason for i in left_out} == {
        "b": "CI is red, not green",
        "c": "CI never watched this branch (watch it with `stella watch`, or merge with --unwatched)",
    }
    queue, left_out = plan_queue(run, unwatched=True)
    assert [i.task_id for i in queue] == ["a", "b", "c"] and left_out == []
