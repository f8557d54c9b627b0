"""Issue 49 item 14: the README's ledger query, run as the README gives it, shows why a failed attempt
failed (`error`) beside its `summary`, which for a red check is the worker's `committed ...`."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_attempts import FAILED_IN_LATEST_RUN
from stellafleet.testing.sample_ledger import add_run

README = Path(__file__).resolve().parents[2] / "README.md"
RED = "check failed: exit 1: 1 test failed"


def _readme_query() -> str:
    """The SQL of the README's `sqlite3 .stella/private/fleet.db "..."` example."""
    found = re.search(r'sqlite3 \.stella/private/fleet\.db \\\n\s*"(.*?)"', README.read_text(), re.S)
    assert found, "the README's ledger query"
    return found.group(1)


def test_the_readmes_ledger_query_shows_why_a_red_check_failed(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        add_run(ledger, "r-20261201-090000-aaaa")
        ledger.tasks.add("r-20261201-090000-aaaa", [PlanTask("t1", "p", "t")], {"t1": 1})
        attempt = ledger.attempts.start("r-20261201-090000-aaaa", "t1", pipeline="command")
        end = AttemptEnd(AttemptOutcome.FAILED, "committed 5e5f8bb2 add the parser", error=RED, exit_code=0)
        ledger.attempts.finish(attempt, end)
    query = _readme_query()
    assert " ".join(query.split()) == " ".join(FAILED_IN_LATEST_RUN.split())  # what `stella demo` runs too
    with sqlite3.connect(db) as conn:
        rows = conn.execute(query).fetchall()
    assert rows == [("t1", None, "committed 5e5f8bb2 add the parser", RED)]
