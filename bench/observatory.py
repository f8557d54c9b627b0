"""Observatory serving speed on a big ledger: 10,000 runs and 100,000 attempts, over real HTTP.

The ledger's schema comes from Ledger.open (the real migrations); its rows are bulk-inserted here with
executemany, because building 10,000 runs one write transaction at a time only measures the disk.
The observatory then serves it from a thread of this process on a free loopback port, and a client
fetches, each time on a new connection (as a browser's first visit does):

  - the runs page (the HTML), and its script and stylesheet,
  - the API's first page of runs (what the Fleet runs card shows first), the last page, and one run,

beside the raw SQL behind the first page (the count, the page of runs, the task and attempt counts
for it) on a read-only connection: the floor any implementation pays. Medians of --repeat requests.
Target: the runs page and the API's first page each under 200 ms.

    python bench/observatory.py [--runs 10000] [--attempts-per-run 10] [--repeat 31] [--dir DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from stellafleet.observatory.server import PAGE_LIMIT_DEFAULT, make_server
from stellafleet.state.ledger import Ledger

TASKS_PER_RUN = 5
START_MS = 1_780_000_000_000


def run_id(n: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime((START_MS + n * 600_000) / 1000))
    return f"r-{stamp}-{n % 65536:04x}"


def build(path: Path, runs: int, attempts_per_run: int) -> float:
    """Schema through the Ledger, rows in bulk; returns the seconds it took."""
    start = time.perf_counter()
    Ledger.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    run_rows, task_rows, attempt_rows = [], [], []
    for n in range(runs):
        rid = run_id(n)
        created = START_MS + n * 600_000
        run_rows.append((
            rid, created, created + 240_000, "failed" if n % 5 == 0 else "succeeded", "plan.toml", "ab" * 32,
            "main", "c" * 40, 3, 5.0, 1.25, "plain", '["stella", "fleet", "--plan", "plan.toml"]', "/repo",
            1000 + n, 1 if n % 5 == 0 else 0,
        ))  # fmt: skip
        for t in range(TASKS_PER_RUN):
            status = (
                "failed" if (n % 5 == 0 and t == 1) else "skipped" if (n % 5 == 0 and t == 2) else "succeeded"
            )
            task_rows.append((rid, f"t{t}", f"Task {t}", "do the thing", 1 + t // 2, status))
        for a in range(attempts_per_run):
            started = created + a * 20_000
            ok = 0 if a % 7 == 0 else 1
            attempt_rows.append((
                rid, f"t{a % TASKS_PER_RUN}", started, started + 15_000, ok, "succeeded" if ok else "failed",
                0 if ok else 1, 0.125, 12_000, 800, 9, "Did the thing and ran the tests.", "plain",
            ))  # fmt: skip
    conn.executemany(
        "INSERT INTO runs (id, created_at_ms, finished_at_ms, status, plan_path, plan_sha256, base_ref,"
        " base_commit, max_concurrency, spend_limit_usd, spend_usd, pipeline, argv, root, pid, exit_code)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        run_rows,
    )
    conn.executemany(
        "INSERT INTO tasks (run_id, id, title, prompt, wave, status) VALUES (?, ?, ?, ?, ?, ?)", task_rows
    )
    conn.executemany(
        "INSERT INTO attempts (run_id, task_id, started_at_ms, finished_at_ms, success, outcome, exit_code,"
        " spend_usd, input_tokens, output_tokens, steps, summary, pipeline)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        attempt_rows,
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up once (first-use imports, page cache)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def fetcher(base_url: str) -> Callable[[str], bytes]:
    parts = urlsplit(base_url)

    def get(path: str) -> bytes:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise SystemExit(f"GET {path}: HTTP {response.status}: {body[:200]!r}")
            return body
        finally:
            conn.close()

    return get


def raw_first_page(db: Path, limit: int) -> Callable[[], object]:
    """The SQL behind the API's first page, on a read-only connection, without Python around it."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, check_same_thread=False)

    def query() -> object:
        conn.execute("SELECT count(*) FROM runs").fetchone()
        rows = conn.execute(
            "SELECT * FROM runs ORDER BY created_at_ms DESC, id DESC LIMIT ? OFFSET 0", (limit,)
        ).fetchall()
        ids = json.dumps([row[0] for row in rows])
        conn.execute(
            "SELECT run_id, status, count(*) FROM tasks WHERE run_id IN (SELECT value FROM json_each(?))"
            " GROUP BY run_id, status",
            (ids,),
        ).fetchall()
        return conn.execute(
            "SELECT run_id, count(*) FROM attempts WHERE run_id IN (SELECT value FROM json_each(?))"
            " GROUP BY run_id",
            (ids,),
        ).fetchall()

    return query


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--attempts-per-run", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=31)
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    limit = PAGE_LIMIT_DEFAULT
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        db = Path(tmp) / "fleet.db"
        seconds = build(db, args.runs, args.attempts_per_run)
        attempts = args.runs * args.attempts_per_run
        print(
            f"observatory serving  (sqlite {sqlite3.sqlite_version}; {args.runs:,} runs, "
            f"{args.runs * TASKS_PER_RUN:,} tasks, {attempts:,} attempts; built in {seconds:.1f}s; "
            f"median of {args.repeat} requests, each on a new connection)"
        )
        server = make_server(db, port=0)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            get = fetcher(server.url)
            last_offset = max(args.runs - limit, 0)
            one_run = run_id(args.runs // 2)
            baseline = median_ms(raw_first_page(db, limit), args.repeat)
            figures = {
                "runs page HTML  GET /": median_ms(lambda: get("/"), args.repeat),
                "  its script    GET /static/app.js": median_ms(lambda: get("/static/app.js"), args.repeat),
                "  its styles    GET /static/app.css": median_ms(lambda: get("/static/app.css"), args.repeat),
                f"API first page GET /api/runs?limit={limit}": median_ms(
                    lambda: get(f"/api/runs?limit={limit}&offset=0"), args.repeat
                ),
                "API last page   GET /api/runs?offset=...": median_ms(
                    lambda: get(f"/api/runs?limit={limit}&offset={last_offset}"), args.repeat
                ),
                f"API one run     GET /api/runs/<id> ({args.attempts_per_run} attempts)": median_ms(
                    lambda: get(f"/api/runs/{one_run}"), args.repeat
                ),
            }
            page = json.loads(get(f"/api/runs?limit={limit}&offset=0"))
            assert page["total"] == args.runs and len(page["runs"]) == min(limit, args.runs)
        finally:
            server.shutdown()
            server.server_close()
    print(f"  baseline: raw SQL behind the first page ({limit} runs)       {baseline:8.2f} ms")
    for name, ms in figures.items():
        print(f"  {name:<58} {ms:8.2f} ms   ({ms / baseline:6.1f}x baseline)")
    load = sum(ms for name, ms in figures.items() if not name.startswith("API l") and "one run" not in name)
    print(f"  first visit, sequentially (HTML + JS + CSS + API first page) {load:8.2f} ms")
    html = figures["runs page HTML  GET /"]
    first = figures[f"API first page GET /api/runs?limit={limit}"]
    verdict = "meets" if max(html, first) < 200 else "MISSES"
    print(f"  target: runs page and API first page each < 200 ms: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
