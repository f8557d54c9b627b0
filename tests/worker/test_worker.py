"""The worker process, `python -m stellafleet.worker.main`, with a real ledger and real pipelines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fleet import RUN, install_pipeline, make_attempt, write_config

from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.state.ledger import Ledger
from stellafleet.worker.main import LedgerSpend, write_result


def run_worker(ctx: WorkerContext, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ctx.to_env(), **extra}
    return subprocess.run(
        [sys.executable, "-m", "stellafleet.worker.main"],
        cwd=ctx.workspace,
        env=env,
        capture_output=True,
        text=True,
    )


def attempt_row(ctx: WorkerContext) -> dict[str, object]:
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        return next(a for a in ledger.get_run(RUN)["attempts"] if a["id"] == ctx.attempt_id)


def test_the_worker_runs_its_pipeline_reports_spend_to_the_ledger_and_writes_its_result(
    tmp_path: Path, isolated_home: Path
) -> None:
    ctx = make_attempt(tmp_path)
    report = json.dumps(
        {"spend_usd": 0.42, "input_tokens": 10, "output_tokens": 5, "steps": 2, "summary": "ok!"}
    )
    write_config(tmp_path, run=f"echo '{report}' > \"$STELLA_COMMAND_RESULT\"")
    proc = run_worker(ctx)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(ctx.result_path.read_text())
    assert result["success"] is True and result["summary"] == "ok!" and result["spend_usd"] == 0.42
    row = attempt_row(ctx)
    assert (row["spend_usd"], row["input_tokens"], row["output_tokens"], row["steps"]) == (0.42, 10, 5, 2)
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        assert ledger.spend.of_run(RUN) == pytest.approx(0.42)
    left = sorted(p.name for p in ctx.result_path.parent.iterdir())  # no temporary files left behind
    assert left == sorted([ctx.result_path.name, f"t1-{ctx.attempt_id}.command.json"])
    assert f"task t1 attempt {ctx.attempt_id} pipeline command" in proc.stdout


def test_a_failing_pipeline_gives_exit_1_and_a_failed_result(tmp_path: Path, isolated_home: Path) -> None:
    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="echo 'tests still red'; exit 1")
    proc = run_worker(ctx)
    assert proc.returncode == 1
    result = PipelineResult.from_json(json.loads(ctx.result_path.read_text()))
    assert not result.success and result.summary == "tests still red"


def test_an_unknown_pipeline_or_a_crash_becomes_a_failed_result_with_the_error(
    tmp_path: Path, isolated_home: Path
) -> None:
    ctx = make_attempt(tmp_path)
    proc = run_worker(ctx, STELLA_PIPELINE="no-such-pipeline")
    assert proc.returncode == 1
    result = json.loads(ctx.result_path.read_text())
    assert result["success"] is False and "unknown pipeline 'no-such-pipeline'" in result["error"]

    boom = (
        "class Boom:\n"
        "    name = 'boom'\n    description = 'always crashes'\n"
        "    def preflight(self, config): return None\n"
        "    def version(self): return None\n"
        "    def run(self, ctx, config, spend):\n"
        "        spend.add(0.05, steps=1)\n"
        "        raise RuntimeError('the model server went away')\n"
    )
    crash = make_attempt(tmp_path, "t2")
    site = install_pipeline(tmp_path / "plugins", "boom", "boom_pipeline:Boom", boom)
    proc = run_worker(crash, STELLA_PIPELINE="boom", **site)
    assert proc.returncode == 1
    result = json.loads(crash.result_path.read_text())
    assert result["error"] == "RuntimeError: the model server went away"
    assert result["summary"] == "worker error: RuntimeError: the model server went away"
    assert "Traceback" in proc.stderr  # the details go to the log, the result keeps one line
    assert attempt_row(crash)["spend_usd"] == pytest.approx(0.05)  # spent before the crash: still counted


def test_outside_a_fleet_the_worker_refuses(tmp_path: Path, isolated_home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stellafleet.worker.main"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "not inside a fleet worker" in proc.stderr


def test_spend_only_claimed_in_the_result_is_still_recorded_once(tmp_path: Path, isolated_home: Path) -> None:
    ctx = make_attempt(tmp_path)
    spend = LedgerSpend(ctx)
    spend.add(0.10, input_tokens=100, steps=1)
    result = PipelineResult(True, "done", spend_usd=0.25, input_tokens=150, output_tokens=20, steps=3)
    spend.settle(result)
    spend.settle(result)  # idempotent
    spend.close()
    row = attempt_row(ctx)
    assert row["spend_usd"] == pytest.approx(0.25)
    assert (row["input_tokens"], row["output_tokens"], row["steps"]) == (150, 20, 3)
    under = PipelineResult(True, "done", spend_usd=0.01)  # a result never lowers what was reported
    spend2 = LedgerSpend(ctx)
    spend2.add(0.5)
    spend2.settle(under)
    spend2.close()
    assert under.spend_usd == 0.5


def test_results_are_written_whole(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "result.json"
    write_result(target, PipelineResult(False, "partial", "boom"))
    write_result(target, PipelineResult(True, "final"))
    assert json.loads(target.read_text())["summary"] == "final"
    assert [p.name for p in target.parent.iterdir()] == ["result.json"]
