"""Keep API keys out of everything the engine writes: transcripts, logs, error messages; and the JSONL
transcript of one attempt: every model reply and tool result, keys masked (or an agent CLI's output)."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stellafleet.core.clock import wall_ms

# A safety net for keys that were never registered (e.g. echoed back by a proxy).
_KEY_SHAPES = re.compile(r"\b(sk-(?:ant-)?[A-Za-z0-9_\-]{16,})")
MASK = "[redacted]"


class Redactor:
    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets: list[str] = []
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        # Very short values would mask ordinary words; real keys are long.
        if secret and len(secret) >= 8 and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return _KEY_SHAPES.sub(MASK, text)


class Transcript:
    def __init__(self, path: Path | None, redact: Redactor | None = None) -> None:
        self.path = None if path is None or str(path) == os.devnull else Path(path)
        self.redact = redact or Redactor()
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, **data: Any) -> None:
        """Append one record, keys masked."""
        self.append(self.redact(json.dumps({"at_ms": wall_ms(), "type": kind, **data}, default=str)))

    def append(self, line: str) -> None:
        """Append one line as it is; written and flushed at once, so a crash keeps everything before it."""
        if self.path is None:
            return
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
