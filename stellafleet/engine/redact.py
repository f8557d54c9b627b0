"""Keep API keys out of everything the engine writes: transcripts, logs, error messages."""

from __future__ import annotations

import re
from collections.abc import Iterable

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
