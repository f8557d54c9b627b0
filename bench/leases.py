"""What leases cost an attempt: the time to take a named lock and lease N ports (each verified free by
binding it) from the host's lease store (state/leases.py), with A attempts starting at once, spread over F
fleet processes (their threads, as a fleet's attempts are). Each attempt takes a lock of its own (a lock in
common would measure the wait, not the store) and releases nothing until all are done, so the store holds
A locks and A x N ports at the end. Figures: the per-attempt p50, p99 and worst, in ms; the target is
under 20 ms at p99 for 64 attempts on 2 cores.

    python bench/leases.py [--attempts 64] [--fleets 4] [--ports 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from stellafleet.state.leases import LeaseHolder, LeaseStore, PortAsk

TARGET_MS = 20.0


def fleet(number: int, attempts: int, ports: int, start: Any, finish: Any, out: Any) -> None:
    """One fleet process: its attempts as threads, all let go at once with every other fleet's; it lives on
    (holding its leases) until every fleet is done."""
    times: list[float] = []
    leased: list[int] = []
    with LeaseStore.open() as store:
        ready = threading.Barrier(attempts + 1)

        def attempt(index: int) -> None:
            repo = Path(f"/bench/repo{number}")
            holder = LeaseHolder.here(f"f{number}-{index}", repo, "r-bench", f"t{index}")
            ready.wait()
            began = time.perf_counter()
            taken = store.try_take([f"bench:{number}:{index}"], holder, PortAsk(ports, (20000, 29999)))
            assert isinstance(taken, list), "a lock of its own is never held by another"
            leased.extend(taken)
            times.append((time.perf_counter() - began) * 1000)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(attempts)]
        for thread in threads:
            thread.start()
        start.wait()  # every fleet's threads are ready: they all start now
        ready.wait()
        for thread in threads:
            thread.join()
        out.put((times, leased))
        finish.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=64)
    parser.add_argument("--fleets", type=int, default=4)
    parser.add_argument("--ports", type=int, default=2)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the lease store goes (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["STELLA_HOST_STATE"] = str(args.dir or scratch)
        LeaseStore.open().close()  # created once, as the first fleet on a host does
        share, extra = divmod(args.attempts, args.fleets)
        per_fleet = [share + (n < extra) for n in range(args.fleets)]
        context = multiprocessing.get_context("fork")
        start, finish, out = context.Barrier(args.fleets), context.Barrier(args.fleets + 1), context.Queue()
        procs = [
            context.Process(target=fleet, args=(n, count, args.ports, start, finish, out))
            for n, count in enumerate(per_fleet)
        ]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=120) for _ in procs]
        with LeaseStore.open() as store:
            held = store.held()
        finish.wait()
        for proc in procs:
            proc.join()
    times = sorted(t for found, _ in results for t in found)
    ports = [port for _, leased in results for port in leased]
    assert len(ports) == len(set(ports)) == args.attempts * args.ports, "a port was given twice"
    assert len(held["locks"]) == args.attempts
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(f"{args.attempts} attempts at once in {args.fleets} fleets, a lock and {args.ports} ports each:")
    print(f"  per attempt: p50 {statistics.median(times):.2f} ms, p99 {p99:.2f} ms, worst {times[-1]:.2f} ms")
    print(f"  p99 target: under {TARGET_MS:g} ms ({'met' if p99 < TARGET_MS else 'missed'})")


if __name__ == "__main__":
    main()
