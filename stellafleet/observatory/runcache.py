"""Finished runs' encoded run-page responses, kept while the ledger files are unchanged.

A finished run's page is polled every 10 s by each open tab, and for a run of hundreds of tasks building
its document (timeline, graph, spend) and encoding it costs far more than the few microseconds of two
stat calls. So the response body is kept as bytes, with its gzip copy made the first time a client
accepts one, and a repeat request only writes them out. Any write to the ledger (WAL mode: the -wal file
grows or is rewritten; a checkpoint rewrites the main file) changes a size or a nanosecond mtime, and
drops every entry. A running run is never kept: its document changes with the clock.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core import jsontext
from stellafleet.core.status import RunStatus

FileState = tuple[tuple[int, int] | None, ...]
# Below this a gzip copy saves too little to be worth the client's inflating it.
GZIP_FROM_BYTES = 1024


def _state(path: Path) -> FileState:
    found: list[tuple[int, int] | None] = []
    for name in (str(path), f"{path}-wal"):
        try:
            info = os.stat(name)
            found.append((info.st_mtime_ns, info.st_size))
        except OSError:
            found.append(None)
    return tuple(found)


class Body:
    """One encoded JSON response: its bytes, and their gzip copy once a client has accepted one."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.raw = jsontext.dumps(doc, separators=(",", ":")).encode()
        self.finished = doc["run"]["status"] != RunStatus.RUNNING
        self._gzipped: bytes | None = None

    def encoded(self, *, accept_gzip: bool) -> tuple[bytes, str | None]:
        """(bytes to send, their Content-Encoding): gzip only when accepted and smaller by a margin."""
        if not accept_gzip or len(self.raw) < GZIP_FROM_BYTES:
            return self.raw, None
        if self._gzipped is None:
            # level 1: a fifth of the bytes in about 1 ms for 230 KB, where level 6 takes 3.5 ms for
            # a sixth; a running run's body is compressed afresh on every poll
            self._gzipped = gzip.compress(self.raw, compresslevel=1, mtime=0)
        if len(self._gzipped) > len(self.raw) * 0.9:
            return self.raw, None
        return self._gzipped, "gzip"


class RunPageCache:
    """A few finished runs' response bodies by (endpoint, the reference they were asked for); safe
    between threads."""

    def __init__(self, ledger_path: Path, *, size: int = 8) -> None:
        self.ledger_path = ledger_path
        self.size = size
        self._entries: OrderedDict[tuple[str, str], tuple[FileState, Body]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], build: Callable[[], dict[str, Any]]) -> Body:
        """The body for key: the kept one if the ledger has not changed since, else build()'s, encoded."""
        state = _state(self.ledger_path)  # read before building: a write during build() is a miss next time
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None and kept[0] == state:
                self._entries.move_to_end(key)
                return kept[1]
        body = Body(build())
        if body.finished:
            with self._lock:
                self._entries[key] = (state, body)
                self._entries.move_to_end(key)
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return body
