"""`stella commit`'s scratch directories in the system temp folder, and their removal once their process
is gone.

A commit stages into a private index in a directory of its own (`stella-commit-*`, `stella-index-*`).
A `stella commit` killed with SIGKILL (or SIGTERM, which ends Python without unwinding) never removes it,
and a fleet whose workers time out or are stopped leaves one per stopped commit, each a copy of the
repository's index. The directory's name carries its process's identity (pid and start time), so any
later stella command removes those of processes that no longer run, never a live commit's.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from pathlib import Path

from stellafleet.proc.pids import ProcessIdentity

PREFIXES = ("stella-commit-", "stella-index-")
_NAMED = re.compile(r"(stella-(?:commit|index)-)(\d+)-(\d+)-")


def directory(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A TemporaryDirectory named prefix + this process's identity (prefix: one of PREFIXES)."""
    me = ProcessIdentity.of()
    marker = f"{me.pid}-{int(me.started_at * 1000)}-" if me else ""
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{marker}")


def sweep_dead(where: Path | None = None) -> list[Path]:
    """Remove the scratch directories whose process no longer runs; returns them."""
    removed: list[Path] = []
    for entry in Path(where or tempfile.gettempdir()).glob("stella-*-*-*-*"):
        named = _NAMED.match(entry.name)
        if named is None or not entry.is_dir():
            continue
        if ProcessIdentity(int(named.group(2)), int(named.group(3)) / 1000).is_alive():
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry)
            removed.append(entry)
    return removed
