"""The dashboard on loopback answers only to loopback Host names: a DNS-rebinding name is refused (421)
however closely it resembles one, with or without a port; IPv6 loopback is accepted."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from helpers.needs import missing

from stellafleet.core.errors import StellaError
from stellafleet.observatory.server import ObservatoryServer, make_server
from stellafleet.testing.sample_ledger import build_sample_ledger

Ask = Callable[[str | None], int]


def _status(server: ObservatoryServer, host: str | None) -> int:
    """The status of GET /api/runs sent with exactly this Host header (None: no Host header at all)."""
    address = server.server_address
    request = "GET /api/runs HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    with socket.create_connection((str(address[0]), int(address[1])), timeout=10) as conn:
        conn.sendall((request + "Connection: close\r\n\r\n").encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.fixture(scope="module", params=["127.0.0.1", "::1"])
def ask(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ask]:
    ledger = tmp_path_factory.mktemp("ledger") / "fleet.db"
    build_sample_ledger(ledger)
    try:
        server = make_server(ledger, host=request.param, port=0)
    except StellaError as exc:  # a machine without IPv6 on loopback; anything else is a failure
        missing(f"cannot listen on {request.param}: {exc}")
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield lambda host: _status(server, host)
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "host",
    [
        "localhost.evil", "localhost.evil:8765", "127.0.0.1.nip.io", "127.0.0.1.nip.io:8765",
        "localhostx", "127.0.0.1x", "[::1].evil", "attacker.example", "", None,
    ],
)  # fmt: skip
def test_a_host_that_only_looks_like_loopback_is_refused(ask: Ask, host: str | None) -> None:
    assert ask(host) == 421


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8765",
        "LOCALHOST:1",
        "127.0.0.1",
        "127.0.0.1:8765",
        "127.0.0.2",
        "[::1]",
        "[::1]:8765",
    ],
)
def test_loopback_hosts_are_served(ask: Ask, host: str) -> None:
    assert ask(host) == 200
