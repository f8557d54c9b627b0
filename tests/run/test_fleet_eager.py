"""`--schedule eager`: tasks start as soon as their dependencies succeeded and a slot is free."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import Scripts, by_id, file_locks, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.plan.model import load_plan
from stellafleet.run.eager import chain_times, critical_path, lower_bound, start_order

# One layer of 0.2, 0.2 and 3.2 s tasks (the 1, 1, 8 s scaled down; c long enough that the chain's
# four worker start-ups fit beside it on a loaded machine), a chain of 0.2 s tasks after the first and one
# 0.2 s task after the second: waves wait for the 3.2 s task before every next step.
DURATIONS = {"a": 0.2, "b": 0.2, "c": 3.2, "a2": 0.2, "a3": 0.2, "a4": 0.2, "b2": 0.2}
DEPENDS = {"a2": "a", "a3": "a2", "a4": "a3", "b2": "b"}


def _plan(tmp_path: Path, depends: dict[str, str] = DEPENDS, ids: Any = DURATIONS) -> Path:
    plan = tmp_path / "plan.toml"
    parts = []
    for task_id in ids:
        dep = f'depends_on = ["{depends[task_id]}"]\n' if task_id in depends else ""
        parts.append(f'[[tasks]]\nid = "{task_id}"\nprompt = "p"\n{dep}')
    plan.write_text("\n".join(parts))
    return plan


def _sleepers(root: Path, c: str) -> None:
    """Every task sleeps its DURATIONS, but c runs the command c, and a4 marks its end in $MARKS."""
    tasks = {task_id: f"sleep {s}" for task_id, s in DURATIONS.items()}
    tasks.update(c=c, a4=f'{tasks["a4"]} && touch "$MARKS/a4.done"')
    write_config(root, run="sleep 1", tasks=tasks)


def _intervals(record: dict[str, Any]) -> list[tuple[int, int, str]]:
    return sorted((a["started_at_ms"], a["finished_at_ms"], a["task_id"]) for a in record["attempts"])


def _most_at_once(intervals: list[tuple[int, int, str]]) -> int:
    edges = sorted([(start, 1) for start, _, _ in intervals] + [(end, -1) for _, end, _ in intervals])
    running = most = 0
    for _, step in edges:  # an end at the same millisecond as a start comes first (-1 < 1)
        running += step
        most = max(most, running)
    return most


def _fleet(stella_main: StellaRunner, root: Path, plan: Path, schedule: str, *extra: str, **env: str) -> Any:
    return stella_main(
        *extra, "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "3",
        "--schedule", schedule, cwd=root, env=env,
    )  # fmt: skip


def _started(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return by_id(record["attempts"], "task_id")


def test_eager_runs_the_chains_beside_the_slow_task_where_waves_wait_for_it(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = _plan(tmp_path)
    bound = lower_bound(load_plan(plan), DURATIONS, 3)
    assert bound == pytest.approx(3.2) and critical_path(load_plan(plan), DURATIONS) == pytest.approx(3.2)
    marks = tmp_path / "marks"
    marks.mkdir()

    # waves: nothing of the second wave starts before the first wave's slow task c has ended
    _sleepers(git_repo, c="sleep 0.3")
    proc = _fleet(stella_main, git_repo, plan, "waves", MARKS=str(marks))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["schedule"] == "waves" and {t["status"] for t in record["tasks"]} == {"succeeded"}
    assert _most_at_once(_intervals(record)) <= 3
    waves = _started(record)
    assert all(waves[t]["started_at_ms"] >= waves["c"]["finished_at_ms"] for t in ("a2", "a3", "a4", "b2"))

    # eager: c ends only once a4, at the end of a's chain, has ended: the chain ran beside c (under waves
    # this c would wait for good); no guess at how long anything takes
    (marks / "a4.done").unlink()
    done = '"$MARKS/a4.done"'
    wait = f"i=0; while [ ! -e {done} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; test -e {done}"
    _sleepers(git_repo, c=wait)
    proc = _fleet(stella_main, git_repo, plan, "eager", MARKS=str(marks))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["schedule"] == "eager" and {t["status"] for t in record["tasks"]} == {"succeeded"}
    assert _most_at_once(_intervals(record)) <= 3
    eager = _started(record)
    assert eager["a2"]["started_at_ms"] < eager["c"]["finished_at_ms"], "the chain waited for c"
    assert eager["b2"]["started_at_ms"] < eager["c"]["finished_at_ms"]


def test_eager_never_runs_more_than_max_concurrency_and_skips_a_failed_tasks_dependents(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    ids = {f"t{n}": 0.1 for n in range(1, 9)}
    depends = {"t7": "t2", "t8": "t7"}
    plan = _plan(tmp_path, depends, ids)
    tasks = {task_id: "sleep 0.3" for task_id in ids}
    tasks["t2"] = "sleep 0.1; exit 4"
    write_config(git_repo, run="true", tasks=tasks)
    plan.write_text(
        plan.read_text().replace('id = "t1"\nprompt = "p"\n', 'id = "t1"\nprompt = "p"\nclaims = ["x.txt"]\n')
    )

    proc = _fleet(stella_main, git_repo, plan, "eager")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    status = by_id(record["tasks"])
    assert status["t2"]["status"] == "failed"
    assert status["t7"]["status"] == status["t8"]["status"] == "skipped"
    assert status["t7"]["reason"] == status["t8"]["reason"] == "dependency failed: t2"
    assert all(status[t]["status"] == "succeeded" for t in ("t1", "t3", "t4", "t5", "t6"))
    intervals = _intervals(record)
    assert len(intervals) == 6
    assert _most_at_once(intervals) == 3  # as wide as allowed, and never wider
    assert file_locks(git_repo) == []  # t1's claim released


SPENDER = 'report(spend_usd=0.6, summary=f"{TASK} spent 0.60")\n'


def test_eager_starts_no_new_task_once_the_spend_limit_is_crossed(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    write_config(git_repo, run=scripts.python("spend", SPENDER))
    plan = _plan(tmp_path, {}, {f"t{n}": 0 for n in range(1, 6)})

    proc = stella_main(
        "--spend-limit", "1", "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        "--schedule", "eager", cwd=git_repo,
    )  # fmt: skip

    assert proc.returncode == 3, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["status"] == "spend_limited"
    started = {a["task_id"] for a in record["attempts"]}
    # t1 and t2 run together and cross $1 between them; t3 may only start if one ended under the limit
    assert {"t1", "t2"} <= started and len(started) <= 3
    skipped = [t for t in record["tasks"] if t["status"] == "skipped"]
    assert skipped and all(t["reason"].startswith("spend limit reached") for t in skipped)


def test_schedule_comes_from_the_config_and_plan_show_explains_eager(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = _plan(tmp_path, {"b": "a"}, {"a": 0, "b": 0})
    write_config(git_repo, run="true", extra='[fleet]\nschedule = "eager"\n')
    proc = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run_record(git_repo)["run"]["schedule"] == "eager"
    assert "eager schedule" in proc.stdout

    shown = stella_main(
        "plan", "show", str(plan), "--schedule", "eager", "--max-concurrency", "2", cwd=git_repo
    )
    assert shown.returncode == 0, shown.stderr
    assert "eager schedule: a task starts as soon as every task it depends on has succeeded" in shown.stdout
    assert "one of the 2 worker slots" in shown.stdout


def test_a_plan_run_again_starts_first_the_longest_chain_by_how_long_its_tasks_took_before(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    # a -> a2 is the longest chain in tasks, b alone the longest in time: one slot shows which starts first.
    # A duration is the attempt's, its worker's start-up included: b's 1.5 s outweighs a second start-up
    # (0.3 s on an idle machine, over 2 s on a very loaded one), so the recorded durations say which chain
    # is longer and the second run must start that one first.
    write_config(git_repo, run="true", tasks={"a": "sleep 0.05", "a2": "sleep 0.05", "b": "sleep 1.5"})
    plan = _plan(tmp_path, {"a2": "a"}, {"a": 0, "a2": 0, "b": 0})

    def first_started() -> str:
        proc = stella_main(
            "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "1",
            "--schedule", "eager", cwd=git_repo,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return _intervals(run_record(git_repo))[0][2]

    assert first_started() == "a"  # nothing known yet: the chain of two tasks
    took = {task: (end - start) / 1000 for start, end, task in _intervals(run_record(git_repo))}
    longest = "b" if took["b"] > took["a"] + took["a2"] else "a"  # "b" but on a machine loaded past reason
    assert first_started() == longest, took  # the ledger knows b takes longer than a and a2 together
    plan.write_text(plan.read_text().replace('id = "b"\nprompt = "p"', 'id = "b"\nprompt = "changed"'))
    assert first_started() == "a"  # another prompt is another task: its past says nothing


def test_start_order_times_chains_by_known_durations_and_the_median_of_them_for_the_rest(
    tmp_path: Path,
) -> None:
    plan = load_plan(_plan(tmp_path, {"a2": "a"}, {"a": 0, "a2": 0, "b": 0, "c": 0}))
    assert chain_times(plan, {}) == {"a": 2, "a2": 1, "b": 1, "c": 1}  # unknown: one unit per task
    # a2 and c unknown: each takes the median of the known 1 and 5 seconds, 3
    assert chain_times(plan, {"a": 1.0, "b": 5.0}) == {"a": 4.0, "a2": 3.0, "b": 5.0, "c": 3.0}
    order = start_order(plan, {"a": 1.0, "b": 5.0})
    assert sorted(plan.ids, key=order.__getitem__) == ["b", "a", "a2", "c"]  # a2 and c tie: plan order
