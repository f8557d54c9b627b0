"""The read models of a run that grew: emitted tasks listed and drawn under their parent."""

from __future__ import annotations

from stellafleet.plan.model import plan_from_data
from stellafleet.run.waves import doit_view
from stellafleet.state.dashboard import grown_columns
from stellafleet.state.views import under_parents


def row(task_id: str, parent: str | None = None, depends_on: tuple[str, ...] = ()) -> dict:
    return {"id": task_id, "parent": parent, "depends_on": list(depends_on)}


# as the ledger lists them: the plan's tasks by wave, then the emitted ones in the order they were emitted
ROWS = [
    row("split"),
    row("integrate", depends_on=("split",)),
    row("split.a", "split"),
    row("split.b", "split", ("split.a",)),
    row("split.b.x", "split.b"),
]


def test_emitted_tasks_follow_their_parent_with_their_depth() -> None:
    ordered = under_parents([dict(r) for r in ROWS])
    assert [(t["id"], t["depth"]) for t in ordered] == [
        ("split", 0),
        ("split.a", 1),
        ("split.b", 1),
        ("split.b.x", 2),
        ("integrate", 0),
    ]


def test_the_graph_of_a_grown_run_puts_each_task_after_all_it_waited_for() -> None:
    columns = grown_columns([dict(r) for r in ROWS])
    assert [[t["id"] for t in column] for column in columns] == [
        ["split"],
        ["split.a"],
        ["split.b"],
        ["split.b.x"],
        ["integrate"],  # after split and everything it (and what it emitted) emitted
    ]


def test_plan_list_and_info_mark_the_emitter() -> None:
    plan = plan_from_data({"tasks": [{"id": "split", "prompt": "list the modules", "expands": True}]})
    code, out, _ = doit_view(plan, ["list"])
    assert code == 0 and out.split() == ["split", "list", "the", "modules", "(expands", "at", "run", "time)"]
    code, out, _ = doit_view(plan, ["info", "split"])
    assert code == 0 and "'expands': True" in out
