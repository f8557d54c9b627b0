"""run/estimate.py and the spend arithmetic it rests on, in process: the eager schedule's playback, the
90th-percentile wall time and stop, and the lines that say them (the fleet around it is
tests/run/test_fleet_estimate.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from stellafleet.core.spend import EPSILON_USD, spend_range, where_limit_stops
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import plan_from_data
from stellafleet.run.estimate import (
    SAME_KIND,
    SAME_TASK,
    Estimate,
    TaskEstimate,
    estimate,
    estimate_lines,
    play,
)
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import StepClock, add_run, sample_task

# a, the long one, and c, b's dependent: the eager schedule starts c as soon as b ends, beside a
PLAN = plan_from_data(
    {
        "tasks": [
            {"id": "a", "prompt": "long"},
            {"id": "b", "prompt": "short"},
            {"id": "c", "prompt": "after b", "depends_on": ["b"]},
        ]
    }
)
SECONDS = {"a": 10.0, "b": 2.0, "c": 3.0}


def test_the_eager_playback_starts_each_task_as_soon_as_it_is_ready_and_a_slot_is_free() -> None:
    wall, order = play(PLAN, SECONDS, 2, "eager")
    assert (wall, order) == (10.0, ["a", "b", "c"])  # c runs 2..5 beside a, which ends at 10
    assert play(PLAN, SECONDS, 1, "eager") == (15.0, ["a", "b", "c"])
    assert play(PLAN, {"a": 1.0, "b": 2.0, "c": 3.0}, 2, "eager") == (
        5.0,
        ["b", "a", "c"],
    )  # longest chain first


def test_the_waves_playback_waits_for_each_whole_wave() -> None:
    assert play(PLAN, SECONDS, 2, "waves") == (13.0, ["a", "b", "c"])  # [a, b] for 10 s, then [c]
    assert play(PLAN, SECONDS, 3, "waves") == (13.0, ["a", "b", "c"])


@pytest.mark.parametrize(
    ("amounts", "expected"),
    [
        ([], (0.0, 0.0)),
        ([4.0], (4.0, 4.0)),
        ([3.0, 1.0], (2.0, 3.0)),
        ([5.0, 1.0, 3.0], (3.0, 5.0)),
        ([float(n) for n in range(1, 11)], (5.5, 9.0)),  # ceil(0.9 * 10) = 9th
        ([float(n) for n in range(1, 12)], (6.0, 10.0)),  # ceil(0.9 * 11) = 10th
    ],
)
def test_spend_range_is_the_median_and_the_nearest_rank_90th_percentile(
    amounts: list[float], expected: tuple[float, float]
) -> None:
    assert spend_range(amounts) == expected


@pytest.mark.parametrize(
    ("limit", "stops_at"),
    [(6.0, None), (6.0 - EPSILON_USD, None), (5.99, "c"), (2.99, "b"), (0.5, "a"), (0.0, "a")],
)
def test_where_limit_stops_is_the_first_task_whose_spend_goes_past_the_limit(
    limit: float, stops_at: str | None
) -> None:
    """Spend equal to the limit (to within a rounding) does not stop the run; a cent over does."""
    assert where_limit_stops([("a", 1.0), ("b", 2.0), ("c", 3.0)], limit) == stops_at


def test_where_limit_stops_without_tasks_stops_nowhere() -> None:
    assert where_limit_stops([], 0.0) is None


def history(path: Path) -> Ledger:
    """A ledger where a ran three times (10, 20, 100 s; $1, $2, $9) and b twice, by the plain pipeline."""
    clock = StepClock(1_700_000_000_000)
    ledger = Ledger.open(path, now_ms=clock)
    add_run(ledger, "r-past", pipeline="plain")
    ledger.tasks.add("r-past", [sample_task("a", "long"), sample_task("b", "short")], {"a": 1, "b": 1})
    for task, seconds, usd in [("a", 10, 1.0), ("a", 20, 2.0), ("a", 100, 9.0), ("b", 4, 0.5), ("b", 6, 0.7)]:
        attempt = ledger.attempts.start("r-past", task, pipeline="plain")
        ledger.spend.add(attempt, usd, input_tokens=1, output_tokens=1, steps=1)
        clock.advance(seconds)
        ledger.attempts.finish(
            attempt, AttemptEnd(outcome=AttemptOutcome.SUCCEEDED, exit_code=0, summary="ok")
        )
    return ledger


def prepared(limit: float | None, schedule: str = "eager") -> SimpleNamespace:
    """What estimate() reads of a prepared run (the rest of Prepared is the fleet's)."""
    return SimpleNamespace(
        plan=PLAN,
        plan_path=Path("plan.yaml"),
        default_pipeline="plain",
        options=SimpleNamespace(model=None),
        concurrency=SimpleNamespace(value=2),
        schedule=schedule,
        spend_limit=limit,
    )


def test_the_estimate_plays_the_median_and_the_90th_percentile_and_stops_at_each(tmp_path: Path) -> None:
    with history(tmp_path / "fleet.db") as ledger:
        found = estimate(prepared(limit=4.0), ledger)  # type: ignore[arg-type]
    by_id = {task.task_id: task for task in found.tasks}
    assert by_id["a"] == TaskEstimate("a", "plain", None, SAME_TASK, 3, (2.0, 9.0), (20.0, 100.0))
    assert by_id["b"].seconds == (5.0, 6.0) and by_id["b"].basis == SAME_TASK
    # c never ran, but tasks of its pipeline and model did: all five attempts
    assert (by_id["c"].basis, by_id["c"].attempts, by_id["c"].seconds) == (SAME_KIND, 5, (10.0, 100.0))
    # median: a 20 s beside b 5 s then c 10 s: 20; 90th percentile: a 100 beside b 6 + c 100: 106
    assert found.wall_s == (20.0, 106.0)
    # start order a, b, c; median $2 + $0.6 + $1 = 3.6 holds under $4; at the 90th: $9 at once
    assert found.stops_at == (None, "a")
    assert found.total_usd() == pytest.approx((3.6, 18.7))
    lines = estimate_lines(found)
    assert lines[-2] == "wall time: 20.0s / 1m46s through the eager schedule"
    assert lines[-1] == "spend limit $4.00: not reached at the median; at the 90th percentile it stops at a"


def summary(stops_at: tuple[str | None, str | None], limit: float | None = 5.0) -> Estimate:
    task = TaskEstimate("a", "plain", None, SAME_TASK, 2, (1.0, 2.0), (60.0, 90.0))
    return Estimate("plan.yaml", "waves", 2, [task], (60.0, 90.0), limit, stops_at)


@pytest.mark.parametrize(
    ("stops_at", "said"),
    [
        ((None, None), "spend limit $5.00: likely not reached"),
        ((None, "a"), "spend limit $5.00: not reached at the median; at the 90th percentile it stops at a"),
        (("a", "a"), "spend limit $5.00: likely stops the run at task a (90th percentile: at a)"),
    ],
)
def test_the_spend_limit_line_says_where_it_stops(stops_at: tuple[str | None, str | None], said: str) -> None:
    assert estimate_lines(summary(stops_at))[-1] == said


def test_no_spend_limit_no_line_and_a_task_without_history_is_left_out_by_name() -> None:
    found = summary((None, None), limit=None)
    never = TaskEstimate("z", "codex", "gpt-x", None, 0, None, None)
    found = Estimate(found.plan, found.schedule, 2, [*found.tasks, never], found.wall_s, None, (None, None))
    lines = estimate_lines(found)
    assert (
        lines[0] == "estimate for plan.yaml: 2 tasks, waves, max concurrency 2, from the ledger's history"
        " (median / 90th percentile):"
    )
    assert lines[1] == "  a: $1.00 / $2.00, 1m00s / 1m30s  (from the same task: 2 attempts)"
    assert lines[2] == "  z: no history (codex, model gpt-x): left out"
    assert lines[3] == "total: $1.00 / $2.00 (1 task without history left out)"
    assert lines[-1].startswith("wall time: ")
    assert found.to_json()["likely_stops_at"] is None and found.to_json()["without_history"] == ["z"]


def test_a_task_of_a_pipeline_and_model_never_run_has_no_estimate_and_the_json_says_each_figure(
    tmp_path: Path,
) -> None:
    plan = plan_from_data(
        {
            "tasks": [
                {"id": "a", "prompt": "long"},
                {"id": "n", "prompt": "new", "pipeline": "codex", "model": "gpt-x"},
            ]
        }
    )
    with history(tmp_path / "fleet.db") as ledger:
        found = estimate(SimpleNamespace(**{**vars(prepared(None, "waves")), "plan": plan}), ledger)  # type: ignore[arg-type]
        assert estimate(prepared(None), ledger).stops_at == (None, None)  # no limit: no stop
    assert found.to_json() == {
        "plan": "plan.yaml",
        "schedule": "waves",
        "max_concurrency": 2,
        "history": True,
        "tasks": [
            {
                "task": "a",
                "pipeline": "plain",
                "model": None,
                "basis": SAME_TASK,
                "attempts": 3,
                "spend_usd": {"median": 2.0, "p90": 9.0},
                "duration_s": {"median": 20.0, "p90": 100.0},
            },
            {
                "task": "n",
                "pipeline": "codex",
                "model": "gpt-x",
                "basis": None,
                "attempts": 0,
                "spend_usd": None,
                "duration_s": None,
            },
        ],
        "without_history": ["n"],
        "total_spend_usd": {"median": 2.0, "p90": 9.0},
        "wall_time_s": {"median": 20.0, "p90": 100.0},  # n, unknown, counts no time
        "spend_limit_usd": None,
        "likely_stops_at": None,
    }
    assert estimate_lines(found)[2] == "  n: no history (codex, model gpt-x): left out"


def test_with_no_history_at_all_nothing_is_guessed(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "empty.db") as ledger:
        found = estimate(prepared(3.0), ledger)  # type: ignore[arg-type]
    assert found.known == [] and found.to_json()["total_spend_usd"] is None
    assert found.to_json()["wall_time_s"] is None and found.to_json()["likely_stops_at"] is None
    assert estimate_lines(found) == [
        "estimate for plan.yaml: 3 tasks, eager, max concurrency 2",
        "no estimate: none of these tasks, nor any task of the same pipeline and model, has run before "
        "(the ledger has no history to estimate from); nothing is guessed",
    ]


def test_a_history_with_setup_gives_the_setup_apart_from_the_work(tmp_path: Path) -> None:
    clock = StepClock(1_700_000_000_000)
    with Ledger.open(tmp_path / "fleet.db", now_ms=clock) as ledger:
        add_run(ledger, "r-past", pipeline="plain")
        ledger.tasks.add("r-past", [sample_task("a", "long")], {"a": 1})
        for setup_s, work_s in [(30, 10), (50, 20)]:  # each attempt's time holds its setup's
            attempt = ledger.attempts.start("r-past", "a", pipeline="plain")
            ledger.attempts.set_setup(attempt, setup_s)
            clock.advance(setup_s + work_s)
            ledger.attempts.finish(attempt, AttemptEnd(outcome=AttemptOutcome.SUCCEEDED, summary="ok"))
        plan = plan_from_data({"tasks": [{"id": "a", "prompt": "long"}]})
        found = estimate(SimpleNamespace(**{**vars(prepared(None)), "plan": plan}), ledger)  # type: ignore[arg-type]
    (shown,) = found.to_json()["tasks"]
    assert shown["duration_s"] == {"median": 55.0, "p90": 70.0}  # the whole attempt, as before
    assert (shown["setup_s"], shown["work_s"]) == (
        {"median": 40.0, "p90": 50.0},
        {"median": 15.0, "p90": 20.0},
    )
    assert estimate_lines(found)[1] == (
        "  a: $0.00 / $0.00, 55.0s / 1m10s (setup 40.0s / 50.0s, work 15.0s / 20.0s)"
        "  (from the same task: 2 attempts)"
    )
    assert "setup_s" not in summary((None, None)).to_json()["tasks"][0]  # no setup in its history: no figures
