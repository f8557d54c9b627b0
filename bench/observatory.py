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

Then one big run is added (500 tasks in 10 waves, 2,000 attempts on 16 slots, 20,000 spend events) and
its run page is measured: the first-view document the page fetches (GET /api/runs/<id>/page, built on
every request), an opened attempt's details, the whole run document beside them, and (with chromium and
chromedriver installed) the whole page in headless Chromium, from navigation to its data in hand
(`run-data` mark) and to the run page drawn (`run-rendered`). Target: under 300 ms, API and page
together. Last, the log endpoint serves the last 64 KiB of a 100 MB worker log (a sparse file) recorded
for one of its attempts: under 20 ms.

    python bench/observatory.py [--runs 10000] [--attempts-per-run 10] [--repeat 31] [--dir DIR]
                                [--tasks 500] [--big-attempts 2000] [--spend-events 20000] [--log-mb 100]
                                [--no-browser]
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import os
import random
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from stellafleet.observatory.server import PAGE_LIMIT_DEFAULT, ObservatoryServer, make_server
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


def fetcher(base_url: str, headers: dict[str, str] | None = None) -> Callable[[str], bytes]:
    parts = urlsplit(base_url)

    def get(path: str) -> bytes:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            conn.request("GET", path, headers=headers or {})
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


BIG_RUN = "r-20300101-000000-b16a"
BIG_SLOTS = 16
BIG_WAVES = 10
SUMMARY = "Did the thing and ran the tests; " + "x" * 80


def build_big_run(db: Path, tasks: int, attempts: int, events: int, log_mb: int) -> tuple[float, int]:
    """One run of `tasks` tasks in BIG_WAVES waves (each task depends on two of the wave before), with
    `attempts` attempts scheduled on BIG_SLOTS slots and `events` spend events spread over them; the
    last attempt's log is a sparse `log_mb` MB file beside the ledger. Returns (seconds, that attempt)."""
    start = time.perf_counter()
    rng = random.Random(500)
    created = START_MS + 10**12
    per_wave = max(1, tasks // BIG_WAVES)
    task_rows, attempt_rows, event_rows = [], [], []
    for t in range(tasks):
        wave = min(t // per_wave, BIG_WAVES - 1)
        deps = [f"t{(wave - 1) * per_wave + (t + k) % per_wave}" for k in (0, 7)] if wave else []
        status = "failed" if t % 97 == 5 else "succeeded"
        task_rows.append(
            (BIG_RUN, f"t{t}", f"Task {t} of the big run", "do the thing", json.dumps(deps), wave + 1, status)
        )
    slots = [created] * BIG_SLOTS
    per_task = max(1, attempts // max(1, tasks))
    attempt_id = 10**7
    for n in range(attempts):
        task = min(n // per_task, tasks - 1)
        begin = heapq.heappop(slots)
        took = rng.randint(20_000, 90_000)
        heapq.heappush(slots, begin + took + 500)
        final_try = n % per_task == per_task - 1
        outcome = "succeeded" if final_try and task % 97 != 5 else "failed"
        attempt_rows.append((
            attempt_id + n, BIG_RUN, f"t{task}", begin, begin + took,
            1 if outcome == "succeeded" else 0, outcome, 0.0, SUMMARY, "plain", None,
        ))  # fmt: skip
    per_attempt = max(1, events // max(1, attempts))
    for n in range(events):
        a = attempt_rows[min(n // per_attempt, len(attempt_rows) - 1)]
        event_rows.append(
            (a[0], BIG_RUN, 0.0125, a[3] + (n % per_attempt + 1) * (a[4] - a[3]) // (per_attempt + 1))
        )
    log = db.parent / "logs" / BIG_RUN / "big.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:  # sparse: 100 MB in no time and no disk
        out.truncate(log_mb * 1024 * 1024 - 4096)
        out.seek(0, os.SEEK_END)
        out.write(b"".join(b"worker line %04d: ran the tests\n" % i for i in range(128))[:4096])
    logged = attempt_rows[-1]
    attempt_rows[-1] = (*logged[:-1], str(log))
    spend = sum(e[2] for e in event_rows)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO runs (id, created_at_ms, finished_at_ms, status, max_concurrency, spend_limit_usd,"
        " spend_usd, pipeline, argv, root, pid, exit_code)"
        " VALUES (?, ?, ?, 'failed', ?, 300.0, ?, 'plain', '[]', '/repo', 1, 1)",
        (BIG_RUN, created, max(slots), BIG_SLOTS, spend),
    )
    conn.executemany(
        "INSERT INTO tasks (run_id, id, title, prompt, depends_on_json, wave, status)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        task_rows,
    )
    conn.executemany(
        "INSERT INTO attempts (id, run_id, task_id, started_at_ms, finished_at_ms, success, outcome,"
        " spend_usd, summary, pipeline, log_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        attempt_rows,
    )
    conn.executemany(
        "INSERT INTO spend_events (attempt_id, run_id, usd, at_ms) VALUES (?, ?, ?, ?)", event_rows
    )
    conn.execute(
        "UPDATE attempts SET spend_usd ="
        " (SELECT sum(usd) FROM spend_events e WHERE e.attempt_id = attempts.id) WHERE run_id = ?",
        (BIG_RUN,),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - start, int(logged[0])


def page_render_ms(url: str, repeat: int) -> list[tuple[float, float]] | str:
    """(navigation to the run page drawn, navigation to its data in hand) in headless Chromium, per load
    (the page's `run-rendered` and `run-data` marks); or why it cannot be measured here."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium is not installed"
    chromium = next(
        (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None
    )
    if chromium is None or not os.path.exists("/usr/bin/chromedriver"):
        return "chromium and chromedriver are not installed"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    times = []
    try:
        for _ in range(repeat + 1):
            driver.get("about:blank")
            driver.get(url)
            deadline = time.monotonic() + 30
            mark = None
            while mark is None and time.monotonic() < deadline:
                mark = driver.execute_script(
                    "const m = performance.getEntriesByName('run-rendered');"
                    " return m.length ? m[0].startTime : null"
                )
                if mark is None:
                    time.sleep(0.01)
            if mark is None:
                return "the run page did not render within 30 s"
            bars = driver.execute_script(
                "return document.querySelectorAll('#timeline-chart rect.bar').length"
            )
            assert bars > 0, "the timeline drew no bars"
            data = driver.execute_script("return performance.getEntriesByName('run-data')[0].startTime")
            times.append((float(mark), float(data)))
    finally:
        driver.quit()
    return times[1:]  # the first load fills Chromium's caches


def _page_lines(label: str, rendered: list[tuple[float, float]] | str) -> list[str]:
    if isinstance(rendered, str):
        return [f"  page  {label}: not measured: {rendered}"]
    page = statistics.median(drawn for drawn, _ in rendered)
    data = statistics.median(got for _, got in rendered)
    return [
        f"  page  {label:<52} {page:8.2f} ms   (max {max(d for d, _ in rendered):.0f} ms;"
        f" data in hand {data:.0f} ms, drawing {page - data:.0f} ms)",
        f"        target: run page (API + page) < 300 ms: {'meets' if page < 300 else 'MISSES'}",
    ]


def _api_figures(get: Callable[[str], bytes], args: argparse.Namespace) -> dict[str, float]:
    """Each run-page request (built afresh every time), plus an opened attempt's details."""
    first_view, whole = f"/api/runs/{BIG_RUN}/page", f"/api/runs/{BIG_RUN}"
    attempt = json.loads(get(first_view))["timeline"]["bars"]["attempt"][-1]
    return {
        "first view GET /api/runs/<id>/page": median_ms(lambda: get(first_view), args.repeat),
        "attempt    GET /api/attempts/<id> (opened)": median_ms(
            lambda: get(f"/api/attempts/{attempt}"), args.repeat
        ),
        "whole run  GET /api/runs/<id>": median_ms(lambda: get(whole), args.repeat),
    }


def run_page_figures(
    db: Path, server: ObservatoryServer, get: Callable[[str], bytes], args: argparse.Namespace
) -> str:
    """The big run's page and log endpoint, measured; returns the report's lines."""
    seconds, logged = build_big_run(db, args.tasks, args.big_attempts, args.spend_events, args.log_mb)
    lean = json.loads(get(f"/api/runs/{BIG_RUN}/page"))
    assert len(lean["timeline"]["bars"]["attempt"]) == args.big_attempts
    assert len(lean["graph"]["nodes"]) == args.tasks
    assert lean["spend"]["usd"][-1] == lean["spend"]["total_usd"]
    api = _api_figures(get, args)
    sizes = {path: len(get(path)) for path in (f"/api/runs/{BIG_RUN}/page", f"/api/runs/{BIG_RUN}")}
    chunk = json.loads(get(f"/api/attempts/{logged}/log?tail=65536"))
    assert chunk["size"] == args.log_mb * 1024 * 1024 and chunk["next"] == chunk["size"]
    tail = median_ms(lambda: get(f"/api/attempts/{logged}/log?tail=65536"), args.repeat)
    lean_kib, whole_kib = (size / 1024 for size in sizes.values())
    lines = [
        f"run page of a big run ({args.tasks} tasks, {args.big_attempts:,} attempts on {BIG_SLOTS} slots,"
        f" {args.spend_events:,} spend events; built in {seconds:.1f}s; first view {lean_kib:,.0f} KiB of"
        f" JSON; whole run document {whole_kib:,.0f} KiB)",
        *(f"  API   {name:<52} {ms:8.2f} ms" for name, ms in api.items()),
    ]
    url = f"{server.url}#/runs/{BIG_RUN}"
    if args.no_browser:
        lines.append("  page  in headless Chromium: skipped (--no-browser)")
    else:
        first = page_render_ms(url, args.page_loads)
        lines += _page_lines(f"first view, Chromium (median of {args.page_loads})", first)
    lines.append(f"  log   GET /api/attempts/<id>/log?tail=65536 of a {args.log_mb} MB log    {tail:8.2f} ms")
    lines.append(f"  target: log tail < 20 ms: {'meets' if tail < 20 else 'MISSES'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--attempts-per-run", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=31)
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "out")
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--big-attempts", type=int, default=2_000)
    parser.add_argument("--spend-events", type=int, default=20_000)
    parser.add_argument("--log-mb", type=int, default=100)
    parser.add_argument("--page-loads", type=int, default=7)
    parser.add_argument("--no-browser", action="store_true", help="skip the page render in Chromium")
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
            big = run_page_figures(db, server, get, args)
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
    print(big)
    averages = " / ".join(f"{avg:.2f}" for avg in os.getloadavg())
    print(f"  (load average 1/5/15 min at the end: {averages} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
