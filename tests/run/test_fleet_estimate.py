"""Money known before it is spent: `--estimate` from the ledger's history, and a per-task `max_spend`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from helpers.engine import make_repo
from helpers.enginefleet import configure, plan, scripts
from helpers.fleet import by_id, run_record

from stellafleet.cli import main
from stellafleet.run.control import run_fleet
from stellafleet.run.prepare import FleetOptions
from stellafleet.testing.model_server import ScriptedModelServer


def estimate_of(root: Path, plan_path: Path, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    options = FleetOptions(
        plan_path=str(plan_path),
        max_concurrency=2,
        estimate=True,
        json_mode="--json" in extra,
        spend_limit=float(extra[extra.index("--spend-limit") + 1]) if "--spend-limit" in extra else None,
        cwd=root,
    )
    return run_fleet(options, out=out), out.getvalue()


def test_estimate_of_a_plan_run_twice_rests_on_its_attempts_and_falls_in_their_range(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    ids = ["a", "b", "c"]
    path = plan(root, ids)
    for _ in range(2):
        with ScriptedModelServer([], scripts=scripts(ids, 1)) as server:
            configure(root, server)
            assert main(["-C", str(root), "fleet", "--plan", str(path), "--max-concurrency", "2"]) == 0
    spent = [a["spend_usd"] for a in run_record(root)["attempts"]]
    durations = [(a["finished_at_ms"] - a["started_at_ms"]) / 1000 for a in run_record(root)["attempts"]]
    code, text = estimate_of(root, path, "--json")
    assert code == 0
    found = json.loads(text)
    assert found["history"] is True and found["without_history"] == []
    for task in found["tasks"]:
        assert task["basis"] == "the same task" and task["attempts"] == 2
        assert (
            min(spent) - 1e-9 <= task["spend_usd"]["median"] <= task["spend_usd"]["p90"] <= max(spent) + 1e-9
        )
        assert task["duration_s"]["median"] <= task["duration_s"]["p90"] <= 60
    assert found["total_spend_usd"]["median"] == pytest.approx(
        sum(t["spend_usd"]["median"] for t in found["tasks"])
    )
    # waves of two: a and b, then c; the wall time is the two waves' longest tasks
    medians = {t["task"]: t["duration_s"]["median"] for t in found["tasks"]}
    assert found["wall_time_s"]["median"] == pytest.approx(max(medians["a"], medians["b"]) + medians["c"])
    assert max(durations) > 0
    code, text = estimate_of(root, path)
    assert (
        "from the same task: 2 attempts" in text
        and "total: $" in text
        and "through the waves schedule" in text
    )
    # a limit under two tasks' spend: it likely stops at the third task to start
    per_task = found["tasks"][0]["spend_usd"]["median"]
    code, text = estimate_of(root, path, "--spend-limit", str(per_task * 2.5))
    assert "likely stops the run at task c" in text, text
    code, text = estimate_of(root, path, "--spend-limit", "100")
    assert "spend limit $100.00: likely not reached" in text
    # a new task of the same pipeline and model rests on the others' attempts
    other = root / "other.toml"
    other.write_text('[[tasks]]\nid = "new"\nprompt = "marker-new: something else"\n')
    code, text = estimate_of(root, other, "--json")
    (task,) = json.loads(text)["tasks"]
    assert task["basis"] == "tasks of the same pipeline and model" and task["attempts"] == 6


def test_estimate_of_a_plan_never_run_says_so_instead_of_inventing_numbers(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    with ScriptedModelServer([]) as server:
        configure(root, server)
        code, text = estimate_of(root, plan(root, ["a", "b"]))
        assert code == 0 and "no estimate: none of these tasks" in text and "$" not in text
        code, text = estimate_of(root, plan(root, ["a", "b"]), "--json")
    found = json.loads(text)
    assert found["history"] is False and found["total_spend_usd"] is None and found["wall_time_s"] is None
    assert found["without_history"] == ["a", "b"] and len(server.requests) == 0


def test_max_spend_caps_one_tasks_engine_and_its_guard_is_recorded(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_repo(tmp_path / "repo")
    ids = ["cheap", "free"]
    path = root / "plan.toml"
    path.write_text(
        "[defaults]\nmax_spend = 0.5\n\n"
        '[[tasks]]\nid = "cheap"\nprompt = "marker-cheap: read"\nmax_spend = 0.004\n\n'
        '[[tasks]]\nid = "free"\nprompt = "marker-free: read"\n'
    )
    with ScriptedModelServer([], scripts=scripts(ids, 3)) as server:
        configure(root, server)
        code = main(
            ["-C", str(root), "--spend-limit", "2", "fleet", "--plan", str(path), "--max-concurrency", "2"]
        )
    record = run_record(root)
    attempts = by_id(record["attempts"], "task_id")
    assert attempts["cheap"]["guard_usd"] == pytest.approx(0.004)
    assert attempts["free"]["guard_usd"] == pytest.approx(0.5)  # [defaults]' cap under the $1.00 share
    assert attempts["cheap"]["spend_usd"] <= 0.004
    assert "spend guard" in (attempts["cheap"]["error"] or attempts["cheap"]["summary"])
    assert by_id(record["tasks"])["free"]["status"] == "succeeded" and code == 1


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_the_plan_check_refuses_a_negative_or_non_finite_max_spend(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_repo(tmp_path / "repo")
    path = root / "plan.toml"
    path.write_text(f'[[tasks]]\nid = "a"\nprompt = "p"\nmax_spend = {value}\n')
    assert main(["-C", str(root), "fleet", "--plan", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert 'task "a": max_spend' in err, err
