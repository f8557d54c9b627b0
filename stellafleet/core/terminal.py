"""Text from workers and models, made safe to print: control characters are shown, never obeyed."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# C0 and C1 controls (not newline or tab), DEL, and the Unicode bidirectional controls.
_ESCAPED = [
    *(c for c in range(0x20) if chr(c) not in "\n\t"),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_TABLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _ESCAPED}


# SGR sequences (colours, bold, dim): test runners colour the lines a summary is taken from, and escaped
# they read as noise (`\x1b[2m3 passed`). They are dropped; every other escape sequence stays escaped.
_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def without_colour(text: str) -> str:
    """text without its SGR colour codes."""
    return _SGR.sub("", text)


def printable(text: str) -> str:
    """text without colour codes, each other control character but newline and tab escaped (`\\x1b`)."""
    return without_colour(text).translate(_TABLE)


def single_line(text: str) -> str:
    """printable(text) on one line, so text from elsewhere cannot pass for a line stella wrote."""
    return " ".join(printable(text).split())


def one_line(text: str | None, limit: int, *, cut: str = "...") -> str:
    """single_line(text) in at most limit characters, ending in `cut` when it was cut short."""
    flat = single_line(text or "")
    return flat if len(flat) <= limit else flat[: limit - len(cut)] + cut


# A piece of a line: its text, or its text and a rich style (shown on a terminal, dropped in plain text).
Piece = str | tuple[str, str]


def styled(*pieces: Piece) -> Text:
    """One line from its pieces, every one printable(), as a rich Text (`.plain`: without styles)."""
    from rich.text import Text

    return Text.assemble(
        *((printable(p), "") if isinstance(p, str) else (printable(p[0]), p[1]) for p in pieces)
    )


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """A plain table: its rows as lines of cells two spaces apart, each column but the last padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]


def last_line(path: Path, limit: int = 60, tail: int = 4096) -> str:
    """The last non-blank line of a log (a setup's progress), on one line and cut at limit; "" if none."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - tail))
            lines = log.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return one_line(next((line for line in reversed(lines) if line.strip()), ""), limit, cut="…")
