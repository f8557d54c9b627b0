"""Every JSON stella emits is strict, and absurd amounts never reach the ledger's totals.

Two tasks reporting a spend of 1e308 once made the run's spend `$inf`; `stella runs --json` and
`/api/runs` then wrote a bare `Infinity`, which no browser parses, and the dashboard listed no runs.
"""

from __future__ import annotations

import ast
import json
import math
import sqlite3
import threading
import urllib.request
from pathlib import Path
from typing import Any

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner

import stellafleet
from stellafleet.core import jsontext
from stellafleet.core.paths import StatePaths
from stellafleet.observatory.server import make_server

PACKAGE = Path(stellafleet.__file__).parent


def strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"not strict JSON: bare {constant}")

    return json.loads(text, parse_constant=refuse)


def api_runs(ledger: Path) -> Any:
    server = make_server(ledger, port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with urllib.request.urlopen(server.url + "api/runs", timeout=10) as response:
            return strict(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()


def test_absurd_spend_reports_are_refused_and_every_total_stays_finite(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("rich", "report(spend_usd=1e308)"))
    proc = stella_main("fleet", "--pipeline", "command", "one", "two", cwd=git_repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "$inf" not in proc.stdout and "$?" not in proc.stdout
    record = run_record(git_repo)
    assert record["run"]["spend_usd"] == 0.0
    for task in record["tasks"]:
        assert task["status"] == "failed"
        assert "spend_usd must be a non-negative number of dollars (at most 100000)" in task["reason"]
    runs = strict(stella_main("runs", "--json", cwd=git_repo).stdout)
    assert runs["runs"][0]["spend_usd"] == 0.0
    assert api_runs(StatePaths(git_repo).fleet_db)["runs"][0]["spend_usd"] == 0.0


def test_a_ledger_already_holding_infinity_still_gives_strict_json(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="echo ok")
    assert stella_main("fleet", "--pipeline", "command", "one", cwd=git_repo).returncode == 0
    db = StatePaths(git_repo).fleet_db
    conn = sqlite3.connect(db)
    with conn:  # what an older stella let in
        conn.execute("UPDATE runs SET spend_usd = 1e308 * 10")
        conn.execute("UPDATE attempts SET spend_usd = 1e308 * 10")
    conn.close()
    listing = stella_main("runs", "--json", cwd=git_repo)
    assert listing.returncode == 0, listing.stderr
    run = strict(listing.stdout)["runs"][0]
    assert run["spend_usd"] is None
    detail = stella_main("runs", run["id"], "--json", cwd=git_repo)
    assert strict(detail.stdout)["run"]["spend_usd"] is None
    assert api_runs(db)["runs"][0]["spend_usd"] is None
    table = stella_main("runs", cwd=git_repo, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert table.returncode == 0 and "inf" not in table.stdout, table.stdout + table.stderr


def _json_dump_calls(path: Path) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in ("dump", "dumps")
        and isinstance(node.value, ast.Name)
        and node.value.id == "json"
    ]


def test_commands_observatory_and_run_write_json_only_through_the_strict_helper() -> None:
    # what stella prints, serves, or leaves for others to read
    paths = [
        path for package in ("commands", "observatory", "run") for path in (PACKAGE / package).rglob("*.py")
    ]
    offenders = [call for path in [*paths, PACKAGE / "worker" / "main.py"] for call in _json_dump_calls(path)]
    assert offenders == [], "use stellafleet.core.jsontext (strict JSON) instead of json.dump(s)"


def test_non_finite_numbers_at_any_depth_become_null() -> None:
    value = {"t": (1.5, math.nan, [math.inf, {"x": (-math.inf,)}]), "l": [math.nan], "n": 2}
    expected = '{"t": [1.5, null, [null, {"x": [null]}]], "l": [null], "n": 2}'
    assert jsontext.dumps(value) == expected
    assert jsontext.dumps((math.nan, "a")) == '[null, "a"]'
