"""Fractions of a cent are real money: a fleet's lines, its summary and `stella runs` show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner

CHEAP = 'report(spend_usd=0.003 if TASK == "t1" else 0.0035, summary=f"{TASK} done")'


def test_sub_cent_spend_shows_in_the_lines_the_summary_and_stella_runs(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("cheap", CHEAP))
    proc = stella_main(
        "--spend-limit", "0.015", "fleet", "--pipeline", "command", "--max-concurrency", "1", "one", "two",
        cwd=git_repo, env={"NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "spend limit $0.015, $0.015 per worker" in out  # once `$0.01`
    assert "($0.003)" in out and "($0.0035)" in out, out  # the live lines (once `$0.00`)
    assert "spend $0.0065 of $0.015" in out, out  # the run's total
    assert "$0.00 " not in out and "$0.00)" not in out and "$0.01," not in out
    assert run_record(git_repo)["run"]["spend_usd"] == pytest.approx(0.0065)
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("t1 ", "t2 "))]
    assert [row[3] for row in rows] == ["$0.003", "$0.0035"], out  # the summary table

    table = stella_main("runs", cwd=git_repo, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "$0.0065 / $0.015" in table.stdout, table.stdout
    run_id = json.loads(stella_main("runs", "--json", cwd=git_repo).stdout)["runs"][0]["id"]
    detail = stella_main("runs", run_id, cwd=git_repo, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "$0.003" in detail.stdout and "$0.0035" in detail.stdout, detail.stdout
