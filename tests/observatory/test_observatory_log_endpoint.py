"""The attempt log endpoint over real sockets: offsets and tails, whole characters, only recorded files."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stellafleet.observatory.server import STATIC_FILES, make_server
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

Get = Callable[[str], tuple[int, dict[str, Any]]]


@pytest.fixture
def private(tmp_path: Path) -> Path:
    directory = tmp_path / "repo" / ".stella" / "private"
    directory.mkdir(parents=True)
    return directory


@pytest.fixture
def get(private: Path) -> Iterator[Get]:
    server = make_server(private / "fleet.db", port=0, poll_ms=250)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def fetch(path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    yield fetch
    server.shutdown()
    server.server_close()


def attempt_with(private: Path, log_path: str | None, transcript: str | None = None) -> int:
    with Ledger.open(private / "fleet.db") as ledger:
        if not ledger.runs.page():
            add_run(ledger, "r-20261201-000000-aaaa")
        task = f"t{len(ledger.get_run('r-20261201-000000-aaaa')['attempts'])}"
        return ledger.attempts.start(
            "r-20261201-000000-aaaa", task, pipeline="command", log_path=log_path, transcript_path=transcript
        )


def test_pages_from_the_start_and_follows_by_offset(private: Path, get: Get) -> None:
    log = private / "logs" / "r-20261201-000000-aaaa" / "t0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"".join(b"line %04d\n" % n for n in range(1000)))  # 10,000 bytes
    attempt = attempt_with(private, str(log))
    status, first = get(f"/api/attempts/{attempt}/log?offset=0&limit=4096")
    assert status == 200 and first["exists"] and first["running"] is True
    assert (first["offset"], first["next"], first["size"]) == (0, 4096, 10_000)
    assert first["text"].startswith("line 0000\n") and len(first["text"]) == 4096
    status, second = get(f"/api/attempts/{attempt}/log?offset={first['next']}&limit=65536")
    assert second["next"] == 10_000 and first["text"] + second["text"] == log.read_text()
    with log.open("a") as out:  # the worker writes on: the next read from `next` has just the new bytes
        out.write("fresh line\n")
    _, third = get(f"/api/attempts/{attempt}/log?offset={second['next']}")
    assert third["text"] == "fresh line\n" and third["next"] == third["size"] == 10_011
    _, tail = get(f"/api/attempts/{attempt}/log?tail=21")
    assert tail["text"] == "line 0999\nfresh line\n" and tail["offset"] == 10_011 - 21
    _, past = get(f"/api/attempts/{attempt}/log?offset=99999999")
    assert past["text"] == "" and past["next"] == past["size"]


def test_chunks_hold_whole_characters(private: Path, get: Get) -> None:
    log = private / "multibyte.log"
    log.write_text("añ€😀" * 100, encoding="utf-8")  # 1 + 2 + 3 + 4 bytes per repeat
    attempt = attempt_with(private, str(log))
    text, offset = "", 0
    while offset < log.stat().st_size:
        status, chunk = get(f"/api/attempts/{attempt}/log?offset={offset}&limit=7")
        assert status == 200 and "\ufffd" not in chunk["text"] and chunk["next"] > offset
        text, offset = text + chunk["text"], chunk["next"]
    assert text == "añ€😀" * 100
    _, tail = get(f"/api/attempts/{attempt}/log?tail=6")  # starts mid-character: skipped, not garbled
    assert tail["text"] == "😀" and tail["offset"] == log.stat().st_size - 4


def test_only_files_the_ledger_recorded_inside_private_are_served(
    private: Path, get: Get, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve\n")
    outside = attempt_with(private, str(secret))
    status, body = get(f"/api/attempts/{outside}/log")
    assert status == 403 and "outside" in body["error"] and "do not serve" not in json.dumps(body)
    dotted = attempt_with(private, str(private / "logs" / ".." / ".." / ".." / "secret.txt"))
    assert get(f"/api/attempts/{dotted}/log")[0] == 403
    link = private / "link.log"
    link.symlink_to(secret)  # a link inside private pointing out is refused too
    assert get(f"/api/attempts/{attempt_with(private, str(link))}/log")[0] == 403
    fifo = private / "fifo.log"
    os.mkfifo(fifo)  # never blocks the server, never served
    status, body = get(f"/api/attempts/{attempt_with(private, str(fifo))}/log")
    assert status == 403 and "regular file" in body["error"]
    # the request names an attempt, never a path: path-like input is not an attempt
    for path in ("/api/attempts/..%2Fsecret.txt/log", "/api/attempts/1/../../secret", "/api/attempts/1/x"):
        assert get(path)[0] == 404, path


def test_unknown_attempt_missing_file_and_bad_parameters(private: Path, get: Get) -> None:
    assert get("/api/attempts/7/log")[0] == 404  # no ledger yet
    not_yet = attempt_with(private, str(private / "logs" / "later.log"), transcript=None)
    status, body = get(f"/api/attempts/{not_yet}/log")
    assert status == 200 and body["exists"] is False and body["text"] == ""
    status, body = get(f"/api/attempts/{not_yet}/transcript")
    assert status == 200 and body["path"] is None and body["exists"] is False
    status, body = get("/api/attempts/999/log")
    assert status == 404 and "no attempt 999" in body["error"]
    for bad in ("offset=-1", "limit=0", "limit=99999999", "tail=x"):
        status, body = get(f"/api/attempts/{not_yet}/log?{bad}")
        assert status == 400 and "must be" in body["error"], bad


def test_every_script_builds_text_only() -> None:
    static = Path(__file__).resolve().parents[2] / "stellafleet" / "observatory" / "static"
    scripts = sorted(static.glob("*.js"))
    assert len(scripts) >= 6
    for script in scripts:
        source = script.read_text()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "Function(", ".write("):
            assert banned not in source, (script.name, banned)
        assert f"/static/{script.name}" in STATIC_FILES, script.name  # every module is served
