"""The observatory's HTTP server: one static page and a read-only JSON API, under a strict CSP; an
attempt's log and transcript served in byte ranges, only the recorded files inside the ledger's directory."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import socket
import stat
import sys
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from stellafleet.core import jsontext
from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.status import AttemptOutcome
from stellafleet.proc.pids import pid_alive
from stellafleet.state import dashboard, views
from stellafleet.state.ledger import Ledger

CHUNK_DEFAULT = 64 * 1024
CHUNK_MAX = 1024 * 1024
KINDS = {"log": "log_path", "transcript": "transcript_path"}


class _Refusal(Exception):
    """A request answered with an error status and one line saying why."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status


_CONTINUATION = bytes(range(0x80, 0xC0))


def _utf8_window(data: bytes, *, trim_start: bool) -> tuple[int, int]:
    """(skip, keep): whole characters only at both ends of a chunk, offsets byte-exact."""
    head = data[:3] if trim_start else b""
    skip = len(head) - len(head.lstrip(_CONTINUATION))  # a character begun before the chunk
    end = len(data)
    for back in range(1, min(4, end - skip) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        if need > back:
            end -= back  # an incomplete last character: the next read starts at its lead byte
        break
    return skip, end


def attempt_log(
    ledger_path: Path, attempt_id: int, kind: str, *, offset: int | None, tail: int | None, limit: int
) -> dict[str, Any]:
    """GET /api/attempts/<id>/<kind>: bytes [offset, offset + limit) of the file, or its last `tail` bytes,
    trimmed to whole characters; _Refusal for no such attempt or a file not served."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        attempt = reads.attempts.files(attempt_id)
    if attempt is None:
        raise _Refusal(HTTPStatus.NOT_FOUND, f"no attempt {attempt_id} in the ledger")
    recorded = attempt[KINDS[kind]]
    payload: dict[str, Any] = {
        "attempt": attempt_id,
        "kind": kind,
        "running": attempt["outcome"] == AttemptOutcome.RUNNING,
        "path": recorded,
        "exists": False,
        "offset": 0,
        "next": 0,
        "size": 0,
        "text": "",
    }
    if not recorded:
        return payload  # nothing recorded (a pipeline without a transcript)
    real = Path(os.path.realpath(recorded))
    if not real.is_relative_to(Path(os.path.realpath(ledger_path.parent))):
        raise _Refusal(
            HTTPStatus.FORBIDDEN, "the recorded path is outside the ledger's directory; it is not served"
        )
    try:  # O_NONBLOCK: a FIFO planted at the path must not hang the server; fstat below refuses it
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return payload  # not written yet (the worker has not started) or already removed
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise _Refusal(HTTPStatus.FORBIDDEN, "the recorded path is not a regular file; it is not served")
        size = found.st_size
        start = max(0, size - tail) if tail is not None else min(offset or 0, size)
        length = min(tail if tail is not None else limit, size - start)
        data = os.pread(fd, length, start) if length > 0 else b""
    finally:
        os.close(fd)
    skip, keep = _utf8_window(data, trim_start=start > 0)
    text = data[skip:keep].decode("utf-8", errors="replace")
    payload.update(offset=start + skip, next=start + keep, size=size, text=text, exists=True)
    return payload


log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_POLL_MS = 1500
PAGE_LIMIT_DEFAULT = 25
PAGE_LIMIT_MAX = 200

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    **{
        f"/static/{name}": (name, "text/javascript; charset=utf-8")
        for name in ("app.js", "dom.js", "runviews.js", "timeline.js", "graph.js", "spend.js", "attempt.js")
    },
}


@cache
def _static(name: str) -> bytes:
    return (resources.files("stellafleet.observatory") / "static" / name).read_bytes()


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ObservatoryServer(ThreadingHTTPServer):
    """Serves the dashboard for one ledger file; the ledger is opened read-only per request."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self, address: tuple[str, int], ledger_path: Path, *, poll_ms: int = DEFAULT_POLL_MS
    ) -> None:
        self.ledger_path = ledger_path
        self.poll_ms = poll_ms
        self.alive: views.Alive = pid_alive  # whether a run's fleet runs: its pid, started no later than it
        self.loopback_only = is_loopback(address[0])
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, ObservatoryHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that hung up mid-answer (a page closed, a log tail left) is no error to print."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


class ObservatoryHandler(BaseHTTPRequestHandler):
    server: ObservatoryServer
    server_version = "stella-observatory"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default; -vv shows requests
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, *, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        static = content_type.startswith(("text/css", "text/j"))  # the page's own assets: revalidated
        self.send_header("Cache-Control", "no-cache" if static else "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_json(self, status: int, payload: dict[str, Any], *, head: bool = False) -> None:
        body = jsontext.dumps(payload, separators=(",", ":")).encode()
        self._send(status, body, "application/json; charset=utf-8", head=head)

    def _host_allowed(self) -> bool:
        """Refuse other Host names on loopback: a rebinding DNS name must not read the ledger."""
        if not self.server.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, *, head: bool) -> None:
        try:
            self._dispatch(head=head)
        except ConnectionError:  # the browser went away: nobody to answer
            pass
        except _Refusal as exc:
            self._send_json(exc.status, {"error": str(exc)}, head=head)
        except StellaError as exc:  # the ledger could not be read
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)}, head=head)
        except Exception as exc:  # a bug answers with a JSON error instead of dropping the connection
            log.debug("%s failed", self.path, exc_info=True)
            self._send_json(
                HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}"}
            )

    def _dispatch(self, *, head: bool) -> None:
        if not self._host_allowed():
            raise _Refusal(HTTPStatus.MISDIRECTED_REQUEST, "unexpected Host header")
        parts = urlsplit(self.path)
        path = parts.path
        if path in STATIC_FILES:
            name, content_type = STATIC_FILES[path]
            self._send(HTTPStatus.OK, _static(name), content_type, head=head)
        elif path == "/api/runs":
            self._api_runs(parse_qs(parts.query), head=head)
        elif path.startswith("/api/attempts/") and "/" not in path[len("/api/attempts/") :]:
            self._api_attempt(path[len("/api/attempts/") :], head=head)
        elif path.startswith("/api/attempts/"):
            self._api_attempt_log(path[len("/api/attempts/") :], parse_qs(parts.query), head=head)
        elif path.startswith("/api/runs/") and path.endswith("/page") and len(path) > len("/api/runs//page"):
            self._api_run(unquote(path[len("/api/runs/") : -len("/page")]), first_view=True, head=head)
        elif path.startswith("/api/runs/") and len(path) > len("/api/runs/"):
            self._api_run(unquote(path[len("/api/runs/") :]), first_view=False, head=head)
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon", head=True)
        else:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no such page: {path}")

    def _int_param(self, query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
        raw = query.get(name, [str(default)])[-1]
        value = whole_number(raw)
        if value is None:
            raise _Refusal(HTTPStatus.BAD_REQUEST, f"{name} must be a whole number, not {raw[:40]!r}")
        if not low <= value <= high:
            raise _Refusal(HTTPStatus.BAD_REQUEST, f"{name} must be between {low} and {high}, not {value}")
        return value

    def _ledger(self) -> Path:
        """The ledger file; a 404 until a fleet has created it."""
        if not self.server.ledger_path.exists():
            raise _Refusal(HTTPStatus.NOT_FOUND, "no fleet runs recorded yet")
        return self.server.ledger_path

    def _api_runs(self, query: dict[str, list[str]], *, head: bool) -> None:
        limit = self._int_param(query, "limit", PAGE_LIMIT_DEFAULT, 1, PAGE_LIMIT_MAX)
        offset = self._int_param(query, "offset", 0, 0, 2**62)
        sparks = dashboard.SPARK_POINTS
        page = views.runs_page(
            self.server.ledger_path,
            limit=limit,
            offset=offset,
            now_ms=wall_ms(),
            alive=self.server.alive,
            sparks=sparks,
        )
        page["poll_ms"] = self.server.poll_ms
        self._send_json(HTTPStatus.OK, page, head=head)

    def _api_run(self, ref: str, *, first_view: bool, head: bool) -> None:
        """GET /api/runs/<ref>: the whole run document; GET /api/runs/<ref>/page: the page's first view."""
        load = dashboard.load_first_view if first_view else dashboard.load_run_page
        try:
            doc = load(self._ledger(), ref, now_ms=wall_ms(), alive=self.server.alive)
        except views.UnknownRun as exc:
            raise _Refusal(HTTPStatus.NOT_FOUND, str(exc)) from None
        doc["poll_ms"] = self.server.poll_ms
        self._send_json(HTTPStatus.OK, doc, head=head)

    def _api_attempt(self, raw_id: str, *, head: bool) -> None:
        """GET /api/attempts/<id>: what the attempt panel shows beyond its bar (summary, error, commits)."""
        attempt_id = whole_number(raw_id)
        if attempt_id is None:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no such page: /api/attempts/{raw_id[:40]}")
        found = dashboard.load_attempt(self._ledger(), attempt_id, now_ms=wall_ms(), alive=self.server.alive)
        if found is None:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no attempt {attempt_id} in the ledger")
        self._send_json(HTTPStatus.OK, found, head=head)

    def _api_attempt_log(self, rest: str, query: dict[str, list[str]], *, head: bool) -> None:
        """GET /api/attempts/<id>/log|transcript?offset=N&limit=M, or ?tail=N for the last N bytes."""
        raw_id, _, kind = rest.partition("/")
        attempt = whole_number(raw_id)
        if attempt is None or kind not in KINDS:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no such page: /api/attempts/{rest}")
        limit = self._int_param(query, "limit", CHUNK_DEFAULT, 1, CHUNK_MAX)
        offset = self._int_param(query, "offset", 0, 0, 2**62)
        tail = self._int_param(query, "tail", 0, 0, CHUNK_MAX) if "tail" in query else None
        payload = attempt_log(self._ledger(), attempt, kind, offset=offset, tail=tail, limit=limit)
        self._send_json(HTTPStatus.OK, payload, head=head)


_WHOLE = re.compile(r"-?[0-9]{1,18}")  # ASCII digits ('²'.isdigit() is true), below SQLite's 2**63


def whole_number(text: str) -> int | None:
    """A path or query parameter as a whole number a ledger id can be; None for anything else."""
    return int(text) if _WHOLE.fullmatch(text) else None


def make_server(
    ledger_path: Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, poll_ms: int = DEFAULT_POLL_MS
) -> ObservatoryServer:
    """Bind the dashboard (port 0 picks a free one); a taken port is one clear StellaError (exit 2)."""
    try:
        return ObservatoryServer((host, port), ledger_path, poll_ms=poll_ms)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StellaError(
                f"port {port} on {host} is already in use: stop what holds it or pick another with --port",
                exit_code=EXIT_USAGE,
            ) from None
        raise StellaError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", exit_code=EXIT_USAGE
        ) from None
