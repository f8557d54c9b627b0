"""An attempt's log and transcript in byte ranges: only the recorded files, inside the ledger's directory."""

from __future__ import annotations

import os
import stat
from http import HTTPStatus
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.status import AttemptOutcome
from stellafleet.state.ledger import Ledger

CHUNK_DEFAULT = 64 * 1024
CHUNK_MAX = 1024 * 1024
KINDS = {"log": "log_path", "transcript": "transcript_path"}


class LogRefused(StellaError):
    """The ledger's recorded path points outside the ledger's directory (or is not a regular file)."""


def _utf8_window(data: bytes, *, trim_start: bool) -> tuple[int, int]:
    """(skip, keep): whole characters only at both ends of a chunk, offsets byte-exact."""
    skip = 0
    if trim_start:
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
    end = len(data)
    for back in range(1, min(4, end - skip) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        if need > back:
            end -= back  # an incomplete last character: the next read starts at its lead byte
        break
    return skip, end


def open_recorded(recorded: str, private_dir: Path) -> int:
    """A read-only descriptor on the recorded file if it lies inside private_dir; LogRefused otherwise."""
    real = Path(os.path.realpath(recorded))
    if not real.is_relative_to(Path(os.path.realpath(private_dir))):
        raise LogRefused("the recorded path is outside the ledger's directory; it is not served")
    # O_NONBLOCK: a FIFO planted at the path must not hang the server; fstat below refuses it
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LogRefused("the recorded path is not a regular file; it is not served")
    return fd


def read_range(fd: int, *, offset: int | None, tail: int | None, limit: int) -> dict[str, Any]:
    """Bytes [offset, offset + limit) of the file, or its last `tail` bytes; trimmed to whole characters."""
    size = os.fstat(fd).st_size
    start = max(0, size - tail) if tail is not None else min(offset or 0, size)
    length = min(tail if tail is not None else limit, size - start)
    data = os.pread(fd, length, start) if length > 0 else b""
    skip, keep = _utf8_window(data, trim_start=start > 0)
    return {
        "offset": start + skip,
        "next": start + keep,
        "size": size,
        "text": data[skip:keep].decode("utf-8", errors="replace"),
    }


def attempt_log(
    ledger_path: Path, attempt_id: int, kind: str, *, offset: int | None, tail: int | None, limit: int
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON payload) for GET /api/attempts/<id>/<kind>."""
    with Ledger.open(ledger_path, readonly=True) as reads:
        attempt = reads.attempts.files(attempt_id)
    if attempt is None:
        return HTTPStatus.NOT_FOUND, {"error": f"no attempt {attempt_id} in the ledger"}
    payload: dict[str, Any] = {
        "attempt": attempt_id,
        "kind": kind,
        "running": attempt["outcome"] == AttemptOutcome.RUNNING,
        "path": attempt[KINDS[kind]],
        "exists": False,
        "offset": 0,
        "next": 0,
        "size": 0,
        "text": "",
    }
    if not attempt[KINDS[kind]]:
        return HTTPStatus.OK, payload  # nothing recorded (a pipeline without a transcript)
    try:
        fd = open_recorded(attempt[KINDS[kind]], ledger_path.parent)
    except LogRefused as exc:
        return HTTPStatus.FORBIDDEN, {"error": str(exc)}
    except OSError:
        return HTTPStatus.OK, payload  # not written yet (the worker has not started) or already removed
    try:
        payload.update(read_range(fd, offset=offset, tail=tail, limit=limit), exists=True)
    finally:
        os.close(fd)
    return HTTPStatus.OK, payload
