"""A run that ends with only parked tasks (waiting on a person) and their dependents left: exit 5, each
with the command that answers it; `stella fleet --resume RUN` goes on after the answers."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from stellafleet.core.errors import EXIT_PARKED
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import RunStatus, TaskStatus
from stellafleet.core.words import plural
from stellafleet.pipelines.sessions import PARKED
from stellafleet.run.steps.park import answer_command
from stellafleet.run.waves import WAITS_ON_PARKED
from stellafleet.state.ledger import Ledger


def only_parked(tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The parked tasks' ids when every task that did not succeed is parked or waits on a parked one
    (skipped for it); [] otherwise."""
    parked = [str(t["id"]) for t in tasks if t["status"] == TaskStatus.PARKED]
    prefix = f"{WAITS_ON_PARKED}: "
    for task in tasks:
        status, reason = task["status"], str(task.get("reason") or "")
        if status in (TaskStatus.SUCCEEDED, TaskStatus.PARKED):
            continue
        if status != TaskStatus.SKIPPED or not reason.startswith(prefix):
            return []
    return parked


def parked_reason(tasks: Sequence[Mapping[str, Any]]) -> str | None:
    """`parked: 2 tasks wait on you` when only parked work is left (see only_parked); None otherwise."""
    parked = only_parked(tasks)
    if not parked:
        return None
    return f"parked: {plural(len(parked), 'task')} {'waits' if len(parked) == 1 else 'wait'} on you"


def say_parked(root: Path, code: int, err: IO[str] | None = None) -> int:
    """After a run this process ran that ended parked (exit 5): each parked task's answer command."""
    db = StatePaths(root).fleet_db
    if code != EXIT_PARKED or not db.exists():
        return code
    with Ledger.open(db, readonly=True) as ledger:
        mine = ledger.runs.of_pid(os.getpid())
        record = ledger.get_run(mine) if mine is not None else None
        if record is None or record["run"]["status"] != RunStatus.PARKED:
            return code
        parked, lines = only_parked(record["tasks"]), []
        for attempt in reversed(record["attempts"]):
            fact = ledger.facts.of_attempt(int(attempt["id"])).get(PARKED)
            if attempt["task_id"] in parked and isinstance(fact, dict) and fact.get("item"):
                parked.remove(attempt["task_id"])
                said = f"  task {attempt['task_id']}: {attempt['summary']}"
                lines.append(f"{said}\n    {answer_command(fact['item'], fact)}")
    out = err or sys.stderr
    go_on = f"stella fleet --resume {record['run']['id']}"
    print(
        f"stella fleet: {record['run']['reason']} (`stella inbox`, `stella answer`, then `{go_on}`)", file=out
    )
    for line in reversed(lines):
        print(line, file=out)
    return code
