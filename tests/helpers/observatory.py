"""Serving a ledger with the real observatory in this process, for the HTTP tests."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stellafleet.observatory.server import ObservatoryServer, make_server

Fetch = Callable[..., tuple[int, dict[str, str], bytes]]
Serve = Callable[[Path], Fetch]


def _fetcher(server: ObservatoryServer) -> Fetch:
    def fetch(path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(server.url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    return fetch


@contextmanager
def threaded() -> Iterator[Callable[[ObservatoryServer], ObservatoryServer]]:
    """serve(server) runs it on a thread of this process; every server it ran is shut down after."""
    servers: list[ObservatoryServer] = []

    def serve(server: ObservatoryServer) -> ObservatoryServer:
        servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def serving() -> Iterator[Serve]:
    """Body of the `serve` fixture: serve(ledger) starts a server on a free port and returns its
    fetch(path, headers=None); every server started is shut down after the test."""
    with threaded() as serve:
        yield lambda ledger: _fetcher(serve(make_server(ledger, port=0, poll_ms=250)))
