"""A resume chain: what each run records of the tasks done before it, and what `stella merge` of its last
run says of them."""

from __future__ import annotations

from pathlib import Path

from stellafleet.merge.queue import plan_queue
from stellafleet.plan.model import plan_from_data
from stellafleet.run.resume import Resume, record_lineage
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

RUNS = ("r-20261201-120000-aaaa", "r-20261201-130000-bbbb", "r-20261201-140000-cccc")


def _chain(tmp_path: Path) -> dict:
    """Run 1 did task `done` on its branch; runs 2 and 3 each resumed the one before."""
    plan = plan_from_data(
        {"tasks": [{"id": "done", "prompt": "p", "isolation": "isolated"}, {"id": "left", "prompt": "p"}]}
    )
    with Ledger.open(tmp_path / "fleet.db") as ledger:
        for number, run_id in enumerate(RUNS):
            add_run(ledger, run_id)
            ledger.tasks.add(run_id, plan.tasks, {"done": 1, "left": 1})
            if number == 0:
                ledger.tasks.set_workspace(run_id, "done", "fleet/done-aaaa", None)
                ledger.tasks.set_status(run_id, "done", "succeeded")
            else:
                resume = Resume(run_id=RUNS[number - 1], plan=plan, plan_path=None, done=frozenset({"done"}))
                record_lineage(ledger, run_id, "waves", resume)
        return ledger.get_run(RUNS[2])


def test_a_task_resumed_twice_names_the_run_it_succeeded_in(tmp_path: Path) -> None:
    last = _chain(tmp_path)
    [done] = [task for task in last["tasks"] if task["id"] == "done"]
    assert done["reason"] == f"succeeded in run {RUNS[0]}"


def test_merge_of_the_last_run_of_a_chain_names_the_tasks_done_before_it(tmp_path: Path) -> None:
    _queue, left_out = plan_queue(_chain(tmp_path), unwatched=True)
    assert [(item.task_id, item.reason) for item in left_out] == [
        ("done", f"succeeded in run {RUNS[0]}: its branch lands with that run (`stella merge {RUNS[0]}`)")
    ]
