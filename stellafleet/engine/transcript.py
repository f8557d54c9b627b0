"""The JSONL transcript of one attempt: every model reply and tool result, keys masked."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.engine.redact import Redactor


class Transcript:
    def __init__(self, path: Path | None, redact: Redactor) -> None:
        self.path = None if path is None or str(path) == os.devnull else Path(path)
        self.redact = redact
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, **data: Any) -> None:
        """Append one record; written and flushed at once, so a crash keeps everything before it."""
        if self.path is None:
            return
        line = self.redact(json.dumps({"at_ms": wall_ms(), "type": kind, **data}, default=str))
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
