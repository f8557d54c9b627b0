"""Finished runs' page documents, kept while the ledger files are unchanged.

A finished run's page is polled every 10 s by each open tab, and for a run of hundreds of tasks building
its document (timeline, graph, spend) costs far more than the few microseconds of two stat calls. Any
write to the ledger (WAL mode: the -wal file grows or is rewritten; a checkpoint rewrites the main file)
changes a size or a nanosecond mtime, and drops every entry. A running run is never kept: its document
changes with the clock.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core.status import RunStatus

FileState = tuple[tuple[int, int] | None, ...]


def _state(path: Path) -> FileState:
    found: list[tuple[int, int] | None] = []
    for name in (str(path), f"{path}-wal"):
        try:
            info = os.stat(name)
            found.append((info.st_mtime_ns, info.st_size))
        except OSError:
            found.append(None)
    return tuple(found)


class RunPageCache:
    """A few finished runs' documents by the reference they were asked for; safe between threads."""

    def __init__(self, ledger_path: Path, *, size: int = 8) -> None:
        self.ledger_path = ledger_path
        self.size = size
        self._entries: OrderedDict[str, tuple[FileState, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, ref: str, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The document for ref: the kept one if the ledger has not changed since, else build()'s."""
        state = _state(self.ledger_path)  # read before building: a write during build() is a miss next time
        with self._lock:
            kept = self._entries.get(ref)
            if kept is not None and kept[0] == state:
                self._entries.move_to_end(ref)
                return dict(kept[1])
        doc = build()
        if doc["run"]["status"] != RunStatus.RUNNING:
            with self._lock:
                self._entries[ref] = (state, doc)
                self._entries.move_to_end(ref)
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return dict(doc)
