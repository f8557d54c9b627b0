"""Claim store throughput: acquire + release pairs per second, with 1 and with N contending processes.

The floor is the raw cost of an empty SQLite write transaction (BEGIN IMMEDIATE; COMMIT) in WAL mode on
the same disk, measured in the same run: one acquire + release pair is two write transactions, so
"floor / 2" bounds what any SQLite-backed claim store could do here. An empty transaction writes nothing,
so a second floor writes and deletes one indexed row (the least a real claim costs).

    python bench/claims_throughput.py [--seconds 2] [--processes 8] [--paths 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from stellafleet.state.claims import ClaimStore, Holder


def _empty_transactions(
    db: Path, seconds: float, barrier: mp.synchronize.Barrier | None, out: mp.Queue
) -> None:
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    if barrier is not None:
        barrier.wait()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")
        count += 1
    out.put((count, start, time.perf_counter()))
    conn.close()


def _row_pairs(db: Path, seconds: float, barrier: mp.synchronize.Barrier | None, out: mp.Queue) -> None:
    """A second, realistic floor: one indexed row inserted, then deleted, in two write transactions."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")
    if barrier is not None:
        barrier.wait()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES ('k', ?)", (count,))
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM t WHERE k = 'k'")
        conn.execute("COMMIT")
        count += 1
    out.put((count, start, time.perf_counter()))
    conn.close()


def _pairs(
    db: Path, worker: int, n_paths: int, seconds: float, barrier: mp.synchronize.Barrier | None, out: mp.Queue
) -> None:
    store = ClaimStore.open(db)
    paths = [f"src/w{worker}/file{i}.py" for i in range(n_paths)]
    if barrier is not None:
        barrier.wait()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    attempt = worker * 1_000_000
    while time.perf_counter() < deadline:
        attempt += 1
        holder = Holder.current("r-bench", f"t{worker}", f"worker {worker}", attempt)
        store.acquire(paths, holder)
        store.release_attempt("r-bench", attempt)
        count += 1
    out.put((count, start, time.perf_counter()))
    store.close()


def _run(target, processes: int, args_for) -> float:  # type: ignore[no-untyped-def]
    """Start processes on a barrier; total operations / (last end - first start)."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    barrier = ctx.Barrier(processes) if processes > 1 else None
    procs = [ctx.Process(target=target, args=(*args_for(i), barrier, out)) for i in range(processes)]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"a benchmark process failed with exit code {proc.exitcode}")
    total = sum(r[0] for r in results)
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    return total / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per figure")
    parser.add_argument("--processes", type=int, default=8, help="contending processes")
    parser.add_argument("--paths", type=int, default=3, help="paths per acquire")
    parser.add_argument(
        "--dir", type=Path, default=Path(__file__).parent / "out", help="where the databases go"
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        floor_db = Path(tmp) / "floor.db"
        store_db = Path(tmp) / "store.db"
        ClaimStore.open(store_db).close()
        sqlite3.connect(floor_db).close()
        print(f"claims throughput  (sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpus, dir {args.dir})")
        floor1 = _run(_empty_transactions, 1, lambda i: (floor_db, args.seconds))
        floorn = _run(_empty_transactions, args.processes, lambda i: (floor_db, args.seconds))
        print(f"  floor: empty BEGIN IMMEDIATE;COMMIT (WAL), 1 process        {floor1:10.0f} txn/s")
        print(
            f"  floor: empty BEGIN IMMEDIATE;COMMIT (WAL), {args.processes} processes  {floorn:10.0f} txn/s"
        )
        rows = _run(_row_pairs, 1, lambda i: (floor_db, args.seconds))
        print(f"  floor: one-row insert + delete, 2 transactions, 1 process{'':2} {rows:10.0f} pairs/s")
        one = _run(_pairs, 1, lambda i: (store_db, i, args.paths, args.seconds))
        many = _run(_pairs, args.processes, lambda i: (store_db, i, args.paths, args.seconds))
        label = f"acquire({args.paths} paths)+release pairs"
        print(f"  {label}, 1 process{'':12} {one:10.0f} pairs/s")
        print(f"  {label}, {args.processes} processes{'':10} {many:10.0f} pairs/s")
        print(
            f"  ratio to floor/2 (2 transactions per pair): 1 process {one / (floor1 / 2):.2f}, "
            f"{args.processes} processes {many / (floorn / 2):.2f}"
        )
        print(f"  ratio to the one-row pair floor: 1 process {one / rows:.2f}")
        target = 2000
        verdict = "meets" if many >= target else "MISSES"
        print(f"  target >= {target} pairs/s with {args.processes} processes: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
