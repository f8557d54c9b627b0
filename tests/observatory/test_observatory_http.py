"""The observatory's HTTP side over real sockets: JSON API, paging, headers, read-only, CLI errors."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers.observatory import Fetch, Serve

from stellafleet.core.paths import StatePaths
from stellafleet.observatory.server import CONTENT_SECURITY_POLICY, is_loopback, make_server
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import StepClock, add_run, build_sample_ledger


def api(fetch: Fetch, path: str) -> dict[str, Any]:
    status, headers, body = fetch(path)
    assert status == 200, body
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    return dict(json.loads(body))


def many_runs(db: Path, count: int) -> list[str]:
    clock = StepClock(1_796_000_000_000)
    ids = []
    with Ledger.open(db, now_ms=clock) as ledger:
        for n in range(count):
            clock.advance(60)
            run_id = f"r-20261130-{n:06d}-{n:04x}"
            add_run(
                ledger,
                run_id,
                base_commit="a" * 40,
                max_concurrency=2,
                spend_limit_usd=1.0,
                pipeline="plain",
                argv=["stella", "fleet", "x"],
                pid=1,
            )
            ledger.runs.finish(run_id, "succeeded", exit_code=0)
            ids.append(run_id)
    return ids[::-1]  # newest first


def test_page_assets_and_security_headers(tmp_path: Path, serve: Serve) -> None:
    fetch = serve(tmp_path / "fleet.db")
    status, headers, body = fetch("/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    html = body.decode()
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == ['<script type="module" src="/static/app.js">']  # no inline script at all
    assert "Fleet runs" in html
    for path, kind in (("/static/app.js", "text/javascript"), ("/static/app.css", "text/css")):
        status, headers, body = fetch(path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    js = fetch("/static/app.js")[2].decode()
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js
    assert fetch("/nope")[0] == 404
    assert fetch("/api/runs", headers={"Host": "attacker.example:8765"})[0] == 421  # DNS rebinding


def test_missing_ledger_is_an_empty_page_that_says_how_to_start(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "repo" / ".stella" / "private" / "fleet.db"
    fetch = serve(db)
    page = api(fetch, "/api/runs")
    assert page["ledger_exists"] is False and page["runs"] == [] and page["total"] == 0
    assert page["start_hint"].startswith('stella fleet "')
    status, _, body = fetch("/api/runs/latest")
    assert status == 404 and "no fleet runs" in json.loads(body)["error"]
    assert not db.exists() and not db.parent.exists()  # reading never creates anything


def test_paging_newest_first(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    ids = many_runs(db, 30)
    fetch = serve(db)
    first = api(fetch, "/api/runs?limit=10&offset=0")
    assert first["total"] == 30 and first["limit"] == 10 and first["poll_ms"] == 250
    assert [r["id"] for r in first["runs"]] == ids[:10]
    last = api(fetch, "/api/runs?limit=10&offset=25")
    assert [r["id"] for r in last["runs"]] == ids[25:]
    assert api(fetch, "/api/runs?offset=30")["runs"] == []
    for bad in ("limit=0", "limit=1000", "limit=x", "offset=-1"):
        status, _, body = fetch(f"/api/runs?{bad}")
        assert status == 400, bad
        assert "must be" in json.loads(body)["error"]


def test_run_detail_by_id_prefix_and_latest(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    ids = build_sample_ledger(db)
    fetch = serve(db)
    ok = api(fetch, f"/api/runs/{ids['ok']}")
    assert ok["run"]["status"] == "succeeded" and ok["run"]["spend_limit_usd"] == 6.0
    assert ok["run"]["command"] == "stella --spend-limit 6 fleet --plan feature-buildout.toml"
    assert [w["wave"] for w in ok["waves"]] == [1, 2, 3]
    assert ok["waves"][0]["tasks"][0]["attempts"][0]["summary"].startswith("Added migration 0007")
    assert api(fetch, "/api/runs/latest")["run"]["id"] == ids["failed"]
    failed = api(fetch, f"/api/runs/{ids['failed'][:-1]}")
    report = next(t for w in failed["waves"] for t in w["tasks"] if t["id"] == "report")
    assert report["status"] == "skipped" and report["reason"] == "dependency failed: writer"
    status, _, body = fetch("/api/runs/r-1999")
    assert status == 404 and "no run matches" in json.loads(body)["error"]


def test_observatory_never_writes_the_ledger(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    build_sample_ledger(db)

    wal = Path(f"{db}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    fetch = serve(db)
    api(fetch, "/api/runs")
    api(fetch, "/api/runs/latest")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # SQLite may create an empty write-ahead log beside the file for a reader; nothing is ever written to it
    assert not wal.exists() or wal.stat().st_size == 0


def test_not_a_ledger_is_reported_not_touched(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "fleet.db"
    db.write_text("this is not a database, and must stay as it is\n" * 40)
    fetch = serve(db)
    status, _, body = fetch("/api/runs")
    assert status == 500 and "not a fleet ledger" in json.loads(body)["error"]
    for ref in ("latest", "r-20261130"):  # a broken ledger is not an unknown run
        status, _, body = fetch(f"/api/runs/{ref}")
        assert status == 500 and "not a fleet ledger" in json.loads(body)["error"], (ref, status)
    assert db.read_text().startswith("this is not a database")


def _observatory(repo: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "observatory", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def test_cli_serves_the_repository_ledger(git_repo: Path, spawned: list[Any]) -> None:
    ids = build_sample_ledger(StatePaths(git_repo).fleet_db)
    proc = _observatory(git_repo, "--port", "0")
    spawned.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.match(r"stella observatory: (http://127\.0\.0\.1:\d+/)  ledger: (\S+)", line)
    assert match, line
    assert match.group(2) == str(StatePaths(git_repo).fleet_db)
    with urllib.request.urlopen(match.group(1) + "api/runs", timeout=10) as response:
        assert [r["id"] for r in json.load(response)["runs"]] == [ids["failed"], ids["ok"]]


def test_port_in_use_is_one_clear_line_and_exit_2(git_repo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _observatory(git_repo, "--port", str(port))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        f"stella: error: port {port} on 127.0.0.1 is already in use: "
        "stop what holds it or pick another with --port"
    ]


@pytest.mark.parametrize("port", ["65536", "-1", "99999"])
def test_port_out_of_range_is_a_usage_error(git_repo: Path, port: str) -> None:
    proc = _observatory(git_repo, "--port", port)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in err and "internal error" not in err
    assert f"--port: must be a port number from 0 to 65535, not {port}" in err


def test_non_loopback_host_warns(git_repo: Path, spawned: list[Any]) -> None:
    proc = _observatory(git_repo, "--host", "0.0.0.0", "--port", "0")
    spawned.append(proc)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("stella observatory: http://0.0.0.0:")
    warning = proc.stderr.readline()
    assert warning.startswith("stella: warning: listening on 0.0.0.0, which is not loopback")
    proc.kill()
    proc.wait()


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.1.2.3") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")


def test_a_browser_that_hangs_up_mid_answer_prints_no_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    server = make_server(StatePaths(tmp_path).fleet_db, host="127.0.0.1", port=0)
    try:
        for hung_up in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset by peer")):
            try:
                raise hung_up
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 50000))
        assert capfd.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 50000))
        assert "ValueError: a real bug" in capfd.readouterr().err  # everything else is still reported
    finally:
        server.server_close()


def _raw_get(url: str, target: bytes) -> tuple[int, dict[str, Any]]:
    """GET target as raw bytes (urllib refuses a non-ASCII path): the status and the JSON body."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head, "the connection was dropped with no answer"
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    "target",
    [
        b"/api/attempts/99999999999999999999",
        b"/api/attempts/\xb2",  # '\xb2'.isdigit() is true, int() refuses it
        b"/api/attempts/%C2%B2",
        b"/api/attempts/-1",
        b"/api/attempts/99999999999999999999/log",
        b"/api/attempts/\xb2/transcript",
        b"/api/attempts/1/log?offset=\xb2",
        b"/api/attempts/1/log?tail=99999999999999999999999999",
        b"/api/runs?limit=\xb2",
        b"/api/runs?offset=99999999999999999999999999",
    ],
)
def test_a_numeric_parameter_out_of_reach_is_a_json_error_not_a_dropped_connection(
    tmp_path: Path, target: bytes
) -> None:
    build_sample_ledger(tmp_path / "fleet.db")
    server = make_server(tmp_path / "fleet.db", host="127.0.0.1", port=0)
    # socketserver prints an unhandled handler error's traceback from handle_error: record this
    # server's own, not whatever else in the process writes to stderr
    unhandled: list[BaseException | None] = []
    server.handle_error = lambda request, address: unhandled.append(sys.exc_info()[1])  # type: ignore[method-assign]

    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        status, body = _raw_get(server.url, target)
    finally:
        server.shutdown()
        server.server_close()
    assert status in (400, 404), body
    assert set(body) == {"error"} and body["error"]
    assert unhandled == []
