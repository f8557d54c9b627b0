"""A mid-sized fleet run for the observatory's pictures: 18 tasks in three waves on four worker slots,
a stalled attempt retried, a failure whose dependents are skipped (one of them two levels down), a red CI
branch, spend over time against a limit, and worker logs; optionally still running (two attempts live,
one of them quiet for minutes). Written through the Ledger API, on a step clock, in time order."""

from __future__ import annotations

import heapq
import os
import random
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.core.status import (
    AttemptEnd,
    AttemptOutcome,
    CIState,
    FollowUpReason,
    RunStatus,
    TaskStatus,
)
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import BASE_COMMIT, StepClock, add_run, leave_for_you

RUN_ID = "r-20261201-091500-5e7a"
SLOTS = 4
WAVES = (
    ("parser", "lexer", "config", "cache", "metrics", "auth"),
    ("ast", "errors", "cli", "store", "dashboard", "tokens", "audit"),
    ("codegen", "docs", "release", "bench", "e2e"),
)
DEPENDS = {
    "ast": ("parser", "lexer"), "errors": ("parser",), "cli": ("config",), "store": ("cache",),
    "dashboard": ("metrics",), "tokens": ("auth",), "audit": ("auth", "metrics"),
    "codegen": ("ast",), "docs": ("cli", "errors"), "release": ("cli", "store"),
    "bench": ("store", "metrics"),    "e2e": ("dashboard", "tokens"),
}  # fmt: skip
FAILS = {"parser"}  # so ast and errors are skipped, and codegen and docs after them
STALLS_ONCE = {"cache"}
LIVE = {"bench", "e2e"}  # still running when live; e2e has been quiet for minutes


def _plan() -> tuple[list[PlanTask], dict[str, int]]:
    tasks, waves = [], {}
    for n, names in enumerate(WAVES, start=1):
        for name in names:
            isolation = "isolated" if name in {"dashboard", "store"} else "shared"
            tasks.append(
                PlanTask(name, f"Work on {name}", f"Build the {name} module", DEPENDS.get(name, ()),
                         isolation=isolation)
            )  # fmt: skip
            waves[name] = n
    return tasks, waves


def _events(start_ms: int, live: bool, rng: random.Random) -> list[tuple[int, int, str, dict[str, Any]]]:
    """(time, order, kind, fields) for every attempt start, spend and finish, slot by slot."""
    events: list[tuple[int, int, str, dict[str, Any]]] = []
    skipped: set[str] = set()
    clock = start_ms + 2_000
    for names in WAVES:
        slots = [clock] * SLOTS
        heapq.heapify(slots)
        for name in names:
            if any(dep in FAILS or dep in skipped for dep in DEPENDS.get(name, ())):
                skipped.add(name)
                continue
            tries = [AttemptOutcome.STALLED, AttemptOutcome.SUCCEEDED] if name in STALLS_ONCE else [
                AttemptOutcome.FAILED if name in FAILS else AttemptOutcome.SUCCEEDED]  # fmt: skip
            not_before = clock  # a retry starts once the attempt before it has ended
            for outcome in tries:
                begin = max(heapq.heappop(slots), not_before)
                took = rng.randint(60_000, 240_000)
                not_before = begin + took + 1_500
                events.append((begin, len(events), "start", {"task": name}))
                quiet = live and name == "e2e"
                for at in range(
                    begin + 9_000, begin + took - (took if quiet else 0), rng.randint(9_000, 16_000)
                ):
                    events.append((at, len(events), "spend", {"task": name, "usd": rng.uniform(0.01, 0.06)}))
                if not (live and name in LIVE):
                    events.append((begin + took, len(events), "finish", {"task": name, "outcome": outcome}))
                heapq.heappush(slots, begin + took + 1_500)
        clock = max(slots) + 3_000
    return sorted(events)


def _log(path: Path, at_ms: int, line: str) -> None:
    """Append a line and date the file as the worker would have (the page reads log growth as progress)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as log:
        log.write(line + "\n")
    os.utime(path, (at_ms / 1000, at_ms / 1000))


def build_sample_fleet(path: Path, *, live_pid: int | None = None) -> str:
    """Write the run into the ledger at path (logs beside it, as a fleet does); returns its run id. A live
    run began over 12 minutes ago: pids.pid_alive takes live_pid for its fleet only if that process started
    no later than LEDGER_SPAWN_GRACE_S after it, which a young machine's pid 1 did not; a reader that must
    see the run live passes its own `alive`."""
    live = live_pid is not None
    rng = random.Random(14)
    events = _events(0, live, rng)
    span = events[-1][0]
    start_ms = (wall_ms() - span - 20_000) if live else 1_796_116_500_000
    clock = StepClock(start_ms)
    logs = path.parent / "logs" / RUN_ID
    with Ledger.open(path, now_ms=clock) as ledger:
        add_run(ledger, RUN_ID, plan_path="modules.toml", plan_sha256="ef" * 32, base_commit=BASE_COMMIT,
                max_concurrency=SLOTS, spend_limit_usd=12.0, pipeline="plain",
                argv=["stella", "--spend-limit", "12", "fleet", "--plan", "modules.toml"],
                root=str(path.parent.parent.parent), pid=live_pid or 7100)  # fmt: skip
        tasks, waves = _plan()
        ledger.tasks.add(RUN_ID, tasks, waves)
        running: dict[str, int] = {}
        for at, _, kind, fields in events:
            clock.ms = start_ms + at
            task = fields["task"]
            if kind == "start":
                log = logs / f"{task}.log"
                running[task] = ledger.attempts.start(RUN_ID, task, pipeline="plain", log_path=str(log))
                _log(log, clock.ms, f"[{task}] attempt {running[task]} started")
            elif kind == "spend":
                ledger.spend.add(running[task], fields["usd"], input_tokens=9_000, output_tokens=700, steps=1)
                _log(logs / f"{task}.log", clock.ms, f"[{task}] step: edited src/{task}.py, ran the tests")
            else:
                _finish(ledger, task, running.pop(task), fields["outcome"])
        _settle(ledger, live, clock.ms)
    return RUN_ID


def _finish(ledger: Ledger, task: str, attempt: int, outcome: AttemptOutcome) -> None:
    error = {
        AttemptOutcome.FAILED: "tests failed: test_parse_nested_lists (AssertionError: 3 != 4)",
        AttemptOutcome.STALLED: "no progress for 10 minutes: the worker was stopped",
    }.get(outcome)
    summary = f"Built the {task} module and its tests." if error is None else f"Could not finish {task}."
    ledger.attempts.finish(attempt, AttemptEnd(outcome, summary, error, exit_code=0 if error is None else 1))
    if error is not None:  # what the fleet's request server leaves for a person, until the task succeeds
        leave_for_you(ledger, RUN_ID, task, error, attempt=attempt)
    else:
        ledger.requests.dismiss(RUN_ID, task, None, FollowUpReason.RETRY, "it succeeded")


def _settle(ledger: Ledger, live: bool, now_ms: int) -> None:
    """Skips, the tasks' commits, the red CI branch and (unless live) the run's end."""
    for task, cause in (("ast", "parser"), ("errors", "parser"), ("codegen", "ast"), ("docs", "errors")):
        ledger.tasks.set_status(RUN_ID, task, TaskStatus.SKIPPED, f"dependency failed: {cause}")
    ledger.tasks.set_workspace(
        RUN_ID, "store", "fleet/store-1b2c3d4e5f607182", ".stella/worktrees/store-1b2c"
    )
    isolated = (("store", "5" * 40, "fleet/store-1b2c3d4e5f607182"), ("dashboard", "6" * 40, None))
    for task, sha, branch in isolated:
        ledger.commits.record(
            [(sha, f"{task}: its module", now_ms)],
            run_id=RUN_ID,
            task_id=task,
            attempt_id=None,
            branch=branch,
        )
    done = [
        t["id"]
        for t in ledger.tasks.of_run(RUN_ID)
        if t["status"] == "succeeded" and t["isolation"] == "shared"
    ]
    for number, task in enumerate(done, start=1):  # the shared tasks' commits, made through stella commit
        sha = f"{number:x}".rjust(40, "7")
        ledger.commits.record(
            [(sha, f"{task}: its module", now_ms)],
            run_id=RUN_ID,
            task_id=task,
            attempt_id=None,
            branch="main",
        )
    ledger.ci.upsert(run_id=RUN_ID, branch="fleet/store-1b2c3d4e5f607182", task_id="store", head_sha="5" * 40,
                     pr_url="https://github.com/example/shop/pull/431", pr_number=431, state=CIState.RED,
                     conclusion="failure", reason="2 checks failed", run_urls=[])  # fmt: skip
    leave_for_you(ledger, RUN_ID, "store", "2 checks failed", branch="fleet/store-1b2c3d4e5f607182",
                  reason=FollowUpReason.CI_FIX)  # fmt: skip
    if not live:
        ledger.runs.finish(RUN_ID, RunStatus.FAILED, exit_code=1, reason="1 failed, 4 skipped")
