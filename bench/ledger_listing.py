"""Ledger read speed at scale: what the observatory asks of a ledger with 10,000 runs and 100,000 attempts.

Builds the ledger through the Ledger API (so the build itself measures single-process write throughput),
then times, on a read-only connection as the observatory opens it: count_runs, list_runs pages (first,
middle, last), get_run and resolve_run_id. The baseline is a bare `SELECT * FROM runs ... LIMIT 50`,
the least any page could cost. Target: every page under 200 ms.

    python bench/ledger_listing.py [--runs 10000] [--attempts-per-run 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stellafleet.core.status import AttemptEnd
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import StepClock, add_run


def build(path: Path, runs: int, attempts_per_run: int) -> float:
    tasks = [PlanTask(f"t{i}", "do it", f"Task {i}") for i in range(5)]
    waves = {task.id: 1 + i // 2 for i, task in enumerate(tasks)}
    start = time.perf_counter()
    writes = 0
    with Ledger.open(path, now_ms=StepClock(1_700_000_000_000, tick_ms=7)) as ledger:
        for n in range(runs):
            run_id = f"r-20261130-{n:06d}-ab12"
            add_run(
                ledger,
                run_id,
                plan_path="plan.toml",
                plan_sha256="ab" * 32,
                base_commit="c" * 40,
                max_concurrency=3,
                spend_limit_usd=5.0,
                pipeline="plain",
                pid=1000 + n,
            )
            ledger.tasks.add(run_id, tasks, waves)
            for a in range(attempts_per_run):
                task = tasks[a % len(tasks)].id
                attempt = ledger.attempts.start(run_id, task, pipeline="plain")
                ledger.attempts.finish(
                    attempt,
                    AttemptEnd(
                        outcome="failed" if a % 7 == 0 else "succeeded", exit_code=0, summary="did it"
                    ),
                )
                writes += 2
            ledger.tasks.set_status(run_id, "t0", "succeeded")
            ledger.tasks.set_status(run_id, "t1", "failed", "boom")
            ledger.tasks.set_status(run_id, "t2", "skipped", "dependency failed: t1")
            ledger.runs.finish(run_id, "failed", exit_code=1)
            writes += 6
    return writes / (time.perf_counter() - start)


def best_ms(fn: Callable[[], object], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--attempts-per-run", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        db = Path(tmp) / "fleet.db"
        rate = build(db, args.runs, args.attempts_per_run)
        print(f"ledger listing  (sqlite {sqlite3.sqlite_version}; {args.runs} runs, "
              f"{args.runs * args.attempts_per_run} attempts, {args.runs * 5} tasks)")  # fmt: skip
        print(f"  build through the Ledger API: {rate:,.0f} write transactions/s (one process)")
        raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        floor = best_ms(
            lambda: raw.execute("SELECT * FROM runs ORDER BY created_at_ms DESC LIMIT 50").fetchall()
        )
        print(f"  baseline: bare SELECT of 50 runs                 {floor:8.2f} ms")
        with Ledger.open(db, readonly=True) as ledger:
            last = max(ledger.runs.count() - 50, 0)
            middle_id = ledger.runs.page(limit=1, offset=last // 2)[0]["id"]
            figures = {
                "count_runs": best_ms(ledger.runs.count),
                "list_runs first page (50)": best_ms(lambda: ledger.runs.page(limit=50)),
                "list_runs middle page": best_ms(lambda: ledger.runs.page(limit=50, offset=last // 2)),
                "list_runs last page": best_ms(lambda: ledger.runs.page(limit=50, offset=last)),
                "get_run (10 attempts)": best_ms(lambda: ledger.get_run("r-20261130-000042-ab12")),
                "resolve_run_id(prefix)": best_ms(lambda: ledger.runs.resolve(middle_id[:-2])),
                "resolve_run_id(latest)": best_ms(lambda: ledger.runs.resolve(None)),
            }
        for name, ms in figures.items():
            print(f"  {name:<32} {ms:8.2f} ms   ({ms / floor:5.1f}x baseline)")
        worst = max(ms for name, ms in figures.items() if name.startswith("list_runs"))
        print(f"  target: every page < 200 ms: {'meets' if worst < 200 else 'MISSES'} (worst {worst:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
