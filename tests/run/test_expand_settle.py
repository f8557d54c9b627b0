"""run/expand.py in process: what an expanding task's end records of its fragment."""

from __future__ import annotations

from pathlib import Path

from stellafleet.core.status import AttemptEnd
from stellafleet.plan.model import plan_from_data
from stellafleet.run.expand import Expansions
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

RUN = "r-20261201-110000-eeee"


def _settled(tmp_path: Path, summary: str) -> tuple[AttemptEnd, Expansions]:
    plan = plan_from_data(
        {"defaults": {"pipeline": "command"}, "tasks": [{"id": "split", "prompt": "p", "expands": True}]}
    )
    fragment = tmp_path / "split.plan"
    fragment.write_text('[[tasks]]\nid = "a"\nprompt = "p"\n\n[[tasks]]\nid = "b"\nprompt = "p"\n')
    with Ledger.open(tmp_path / "fleet.db") as ledger:
        add_run(ledger, RUN)
        ledger.tasks.add(RUN, plan.tasks, {"split": 1})
        expansions = Expansions(plan, ledger, RUN, max_emitted=10, max_depth=3)
        end = AttemptEnd(outcome="succeeded", exit_code=0, summary=summary)
        return expansions.settle(plan.tasks[0], fragment, end), expansions


def test_a_summary_that_already_says_what_was_emitted_is_not_said_twice(tmp_path: Path) -> None:
    (tmp_path / "said").mkdir()
    (tmp_path / "unsaid").mkdir()
    assert _settled(tmp_path / "said", "emitted 2 tasks")[0].summary == "emitted 2 tasks"
    assert _settled(tmp_path / "unsaid", "split the work")[0].summary == "split the work (emitted 2 tasks)"


def test_emitted_tasks_run_on_the_plans_default_pipeline(tmp_path: Path) -> None:
    _, expansions = _settled(tmp_path, "split")
    assert [expansions.tasks[t].pipeline for t in ("split.a", "split.b")] == ["command", "command"]
