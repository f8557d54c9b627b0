"""Text from workers and models, made safe to print: control characters are shown, never obeyed.

A task's title comes from a plan and its summary from a model or an agent CLI; printed raw, `\\033[2J`
in a summary cleared the user's screen and `\\033]0;...\\007` set the window title. Everything stella
prints that it did not write itself goes through printable(): on a terminal and in plain output alike.
"""

from __future__ import annotations

# C0 controls but newline and tab, DEL, the C1 controls (0x9b is a one-byte CSI), and the Unicode
# bidirectional embeddings, overrides and isolates (they reorder what follows them on the line).
_ESCAPED = [
    *(c for c in range(0x20) if chr(c) not in "\n\t"),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_TABLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _ESCAPED}


def printable(text: str) -> str:
    """text with every control character written as an escape (`\\x1b`, `\\x07`, `\\u202e`); newlines
    and tabs are kept (callers that need one line flatten them)."""
    return text.translate(_TABLE)
