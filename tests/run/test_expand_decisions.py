"""run/expand.py's decisions, in process against a real ledger: the run-wide cap on emitted tasks (through
--resume too), a fragment exactly filling it, an emitted id that collides, a shared claim made safe by a
dependency, and Ray's rule for expanding emitted tasks (docs/plans.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask, plan_from_data
from stellafleet.run.expand import Expansions
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

RUN = "r-20261201-130000-dddd"
OK = AttemptEnd(outcome=AttemptOutcome.SUCCEEDED, exit_code=0, summary="done")
PLAN = plan_from_data(
    {
        "tasks": [
            {"id": "one", "prompt": "split", "expands": True},
            {"id": "two", "prompt": "split", "expands": True},
            {"id": "two.a", "prompt": "a plan task named like an emitted one"},
        ]
    }
)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    opened = Ledger.open(tmp_path / "fleet.db")
    add_run(opened, RUN)
    opened.tasks.add(RUN, list(PLAN.tasks), {"one": 1, "two": 1, "two.a": 1})
    yield opened
    opened.close()


def fragment(tmp_path: Path, name: str, ids: list[str], extra: str = "") -> Path:
    path = tmp_path / f"{name}.plan"
    path.write_text("".join(f'[[tasks]]\nid = "{i}"\nprompt = "p"\n{extra}\n' for i in ids))
    return path


def expansions(ledger: Ledger, cap: int, **options: object) -> Expansions:
    return Expansions(PLAN, ledger, RUN, max_emitted=cap, max_depth=3, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cap", "accepted"), [(4, True), (3, False)], ids=["exactly-full", "one-over"])
def test_the_cap_counts_every_fragment_of_the_run(
    ledger: Ledger, tmp_path: Path, cap: int, accepted: bool
) -> None:
    grow = expansions(ledger, cap)
    first = grow.settle(PLAN.task("one"), fragment(tmp_path, "one", ["a", "b"]), OK)
    assert first.summary == "done (emitted 2 tasks)" and grow.count == 2
    second = grow.settle(PLAN.task("two"), fragment(tmp_path, "two", ["x", "y"]), OK)
    if accepted:  # 2 + 2 fills a cap of 4 exactly
        assert (second.outcome, second.summary) == (AttemptOutcome.SUCCEEDED, "done (emitted 2 tasks)")
        assert grow.count == 4 and [t.id for t in grow.children("two")] == ["two.x", "two.y"]
    else:
        assert second.outcome == AttemptOutcome.FAILED
        assert second.summary == (
            'its plan fragment was refused: fragment of "two": emits 2 tasks, more than the 1 the run may '
            "still add ([fleet] max_emitted_tasks = 3, 2 emitted so far); emit fewer tasks or raise the limit"
        )
        assert grow.count == 2 and grow.children("two") == ()
    run_tasks = {task["id"] for task in ledger.get_run(RUN)["tasks"]}
    assert ("two.x" in run_tasks) is accepted


def test_the_cap_counts_what_the_resumed_run_emitted(ledger: Ledger, tmp_path: Path) -> None:
    before = (PlanTask("one.a", "p", "", parent="one"), PlanTask("one.b", "p", "", parent="one"))
    grow = expansions(ledger, 3, emitted=before)
    assert grow.count == 2 and grow.depth("one.a") == 1 and grow.depth("one") == 0
    refused = grow.settle(PLAN.task("two"), fragment(tmp_path, "two", ["x", "y"]), OK)
    assert (
        "more than the 1 the run may still add" in refused.summary and "2 emitted so far" in refused.summary
    )


def test_an_emitted_id_the_run_already_has_is_refused(ledger: Ledger, tmp_path: Path) -> None:
    grow = expansions(ledger, 10)
    refused = grow.settle(PLAN.task("two"), fragment(tmp_path, "two", ["a", "b"]), OK)
    assert refused.outcome == AttemptOutcome.FAILED
    assert refused.summary == (
        'its plan fragment was refused: fragment of "two": task "two.a": id: '
        'the run already has a task "two.a"'
    )
    assert grow.count == 0 and grow.children("two") == ()


def test_a_shared_claim_is_fine_when_an_earlier_task_depends_on_the_later_one(
    ledger: Ledger, tmp_path: Path
) -> None:
    path = tmp_path / "one.plan"
    path.write_text(
        '[[tasks]]\nid = "first"\nprompt = "p"\nclaims = ["f.py"]\ndepends_on = ["second"]\n\n'
        '[[tasks]]\nid = "second"\nprompt = "p"\nclaims = ["f.py"]\n'
    )
    grow = expansions(ledger, 10)
    assert grow.settle(PLAN.task("one"), path, OK).outcome == AttemptOutcome.SUCCEEDED
    assert [t.id for t in grow.children("one")] == ["one.first", "one.second"]
    path.write_text(path.read_text().replace('depends_on = ["second"]\n', ""))
    grow = expansions(ledger, 10)
    refused = grow.settle(PLAN.task("two"), path, OK)
    assert 'claims: "f.py" is claimed by task "first" too' in refused.summary


@pytest.mark.parametrize(
    ("isolation", "accepted"), [("shared", True), ("isolated", False)], ids=["shared", "isolated"]
)
def test_under_ray_only_a_shared_emitted_task_may_expand(
    ledger: Ledger, tmp_path: Path, isolation: str, accepted: bool
) -> None:
    """docs/plans.md: a shared expanding task runs here as usual; an isolated one would leave its fragment
    on a node, so the fragment that emits one fails its emitter."""
    grow = expansions(ledger, 10, isolated_remote=True)
    path = fragment(tmp_path, "one", ["deeper"], f'expands = true\nisolation = "{isolation}"\n')
    settled = grow.settle(PLAN.task("one"), path, OK)
    assert (settled.outcome == AttemptOutcome.SUCCEEDED) is accepted
    if not accepted:
        assert settled.summary == (
            'its plan fragment was refused: fragment of "one": task "one.deeper": expands: an isolated task '
            "runs on the Ray cluster, where what it emits would stay on the node: make it shared, or leave "
            "expands out"
        )
    local = expansions(ledger, 10)  # not on Ray: either is fine
    again = fragment(tmp_path, "two", ["deeper"], f'expands = true\nisolation = "{isolation}"\n')
    assert local.settle(PLAN.task("two"), again, OK).outcome == AttemptOutcome.SUCCEEDED


def test_no_fragment_file_leaves_the_end_as_it_was(ledger: Ledger, tmp_path: Path) -> None:
    grow = expansions(ledger, 10)
    assert grow.settle(PLAN.task("one"), None, OK) is OK
    assert grow.settle(PLAN.task("one"), tmp_path / "never-written.plan", OK) == OK
    assert grow.count == 0
