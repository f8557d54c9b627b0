"""Cooperative file claims, in `.stella/private/store.db` (a dead holder's claim is taken over), the write
spans of the attempts whose pipelines report them, and the commit lane, an flock beside it. All claims SQL
lives here."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import asdict, astuple, dataclass, fields
from pathlib import Path

from stellafleet.core.clock import Clock, SystemClock, wall_ms
from stellafleet.core.errors import ClaimConflict, StellaError
from stellafleet.proc.flock import try_lock
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.state.sqlitefile import Database, Handle, Schema

log = logging.getLogger("stellafleet.state.claims")

LANE_POLL_S = 0.02

# The columns of a Holder, in both tables.
_HOLDER_DDL = """
        run_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        task_title TEXT NOT NULL DEFAULT '',
        attempt_id INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        pid_started REAL NOT NULL,"""
_V1 = (
    f"""CREATE TABLE file_locks (
        path TEXT PRIMARY KEY,{_HOLDER_DDL}
        implicit INTEGER NOT NULL DEFAULT 0,
        acquired_at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX file_locks_by_attempt ON file_locks(run_id, attempt_id)",
    f"""CREATE TABLE commit_lane (
        id INTEGER PRIMARY KEY CHECK (id = 1),{_HOLDER_DDL}
        acquired_at_ms INTEGER NOT NULL
    )""",  # no longer used: the lane is an flock (commit_lane below)
)

# When a shared attempt's worker could write the tree: one row per tool call that can write (its pipeline's
# name for the call; end_ns NULL while it runs, or when its end was never reported). Only the attempts in
# span_reporters report them; any other could write at every moment of its run.
_V2 = (
    """CREATE TABLE span_reporters (
        run_id TEXT NOT NULL,
        attempt_id INTEGER NOT NULL,
        PRIMARY KEY (run_id, attempt_id)
    )""",
    """CREATE TABLE write_spans (
        run_id TEXT NOT NULL,
        attempt_id INTEGER NOT NULL,
        span TEXT NOT NULL,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER,
        PRIMARY KEY (run_id, attempt_id, span)
    )""",
)

STORE_SCHEMA = Schema(label="claim store", application_id=0x53544C43, migrations=(_V1, _V2))  # "STLC"

Span = tuple[
    int, int | None
]  # a write span's start and end (None: still open), nanoseconds of the wall clock

_HOLDER_COLUMNS = "run_id, task_id, task_title, attempt_id, pid, pid_started"


@dataclass(frozen=True)
class Holder:
    """Who holds a claim: an attempt of a task, acting through one process."""

    run_id: str
    task_id: str
    task_title: str
    attempt_id: int
    pid: int
    pid_started: float

    @classmethod
    def current(
        cls, run_id: str, task_id: str, task_title: str, attempt_id: int, pid: int | None = None
    ) -> Holder:
        """A holder for pid (default: this process), stamped with that process's start time."""
        identity = ProcessIdentity.of(pid)
        if identity is None:
            raise StellaError(f"no process {pid}: a claim holder must be a running process")
        return cls(run_id, task_id, task_title, attempt_id, identity.pid, identity.started_at)

    def same_attempt(self, other: Holder) -> bool:
        return self.run_id == other.run_id and self.attempt_id == other.attempt_id

    def is_alive(self) -> bool:
        """True while the holder's process runs: its pid is held by no zombie and no later process."""
        return ProcessIdentity(self.pid, self.pid_started).is_alive()

    def describe(self) -> str:
        title = f" ({self.task_title})" if self.task_title else ""
        return f'task "{self.task_id}"{title} (run {self.run_id}, pid {self.pid})'


def _holder(row: sqlite3.Row) -> Holder:
    return Holder(*(row[spec.name] for spec in fields(Holder)))


def _lane_file_holder(fd: int) -> Holder | None:
    """The holder the commit lane's file names, if any."""
    with contextlib.suppress(ValueError, TypeError):
        return Holder(**json.loads(os.pread(fd, 4096, 0) or b"null"))
    return None


def normalize_path(path: str) -> str:
    """The one spelling of a workspace-relative path that claims compare ("./a//b" -> "a/b")."""
    text = path.replace("\\", "/").strip()
    normal = posixpath.normpath(text) if text else ""
    if not normal or normal == "." or normal.startswith("/") or normal == ".." or normal.startswith("../"):
        raise StellaError(f"cannot claim {path!r}: claims are file paths relative to the workspace")
    return normal


class ClaimStore(Handle):
    """The claim store of one repository; safe to share between the threads of one process."""

    def __init__(self, db: Database, clock: Clock) -> None:
        super().__init__(db)
        self.path, self._clock = db.path, clock

    @classmethod
    def open(cls, path: Path, *, clock: Clock | None = None) -> ClaimStore:
        """Open (creating atomically) the claim store; the clock only paces the commit lane's wait."""
        return cls(Database(Path(path), STORE_SCHEMA, readonly=False, now_ms=wall_ms), clock or SystemClock())

    def acquire(self, paths: Sequence[str], holder: Holder) -> None:
        """Claim every path for holder's attempt, or none of them; ClaimConflict names a live holder."""
        self._claim([normalize_path(p) for p in paths], holder, implicit=False)

    def touch(self, path: str, holder: Holder) -> None:
        """The implicit claim a worker takes at its first write of it; ClaimConflict if another holds it."""
        normal = normalize_path(path)
        rows = self._db.read("SELECT run_id, attempt_id FROM file_locks WHERE path = ?", (normal,))
        if rows and rows[0][0] == holder.run_id and rows[0][1] == holder.attempt_id:
            return  # already ours: the common case for every write after the first, without a write lock
        self._claim([normal], holder, implicit=True)

    def _claim(self, paths: list[str], holder: Holder, *, implicit: bool) -> None:
        wanted = list(dict.fromkeys(paths))
        if not wanted:
            return
        reclaimed: dict[str, Holder] = {}  # path -> its dead holder
        with self._db.write() as conn:
            found = {
                row["path"]: _holder(row)
                for row in conn.execute(
                    f"SELECT path, {_HOLDER_COLUMNS} FROM file_locks"
                    " WHERE path IN (SELECT value FROM json_each(?))",
                    (json.dumps(wanted),),
                )
            }
            for path in wanted:
                current = found.get(path)
                if current is None or current.same_attempt(holder):
                    continue
                if current.is_alive():
                    raise ClaimConflict(f"claim conflict: {path} is held by {current.describe()}")
                reclaimed[path] = current
            now = self._db.now_ms()
            conn.executemany(  # a dead holder's row replaced
                "INSERT OR REPLACE INTO file_locks (path, run_id, task_id, task_title, attempt_id, pid,"
                " pid_started, implicit, acquired_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (path, *astuple(holder), int(implicit), now)
                    for path in wanted
                    if path not in found or path in reclaimed
                ],
            )
        for path, old in reclaimed.items():
            log.warning(
                "reclaimed stale claim on %s from %s: that process is no longer running", path, old.describe()
            )

    def release_attempt(self, run_id: str, attempt_id: int) -> int:
        """Free every path held by this attempt (whichever of its processes took it); returns how many."""
        return self._db.execute(
            "DELETE FROM file_locks WHERE run_id = ? AND attempt_id = ?", (run_id, attempt_id)
        ).rowcount

    def paths_of_attempt(self, run_id: str, attempt_id: int) -> list[str]:
        rows = self._db.read(
            "SELECT path FROM file_locks WHERE run_id = ? AND attempt_id = ? ORDER BY path",
            (run_id, attempt_id),
        )
        return [str(row[0]) for row in rows]

    def hand_over(self, run_id: str, attempt_id: int, holder: Holder) -> int:
        """Make holder's process the holder of every path this attempt holds; returns how many."""
        return self._db.execute(
            "UPDATE file_locks SET pid = ?, pid_started = ? WHERE run_id = ? AND attempt_id = ?",
            (holder.pid, holder.pid_started, run_id, attempt_id),
        ).rowcount

    def claims(self) -> list[tuple[str, Holder]]:
        rows = self._db.read(f"SELECT path, {_HOLDER_COLUMNS} FROM file_locks ORDER BY path")
        return [(row["path"], _holder(row)) for row in rows]

    @contextlib.contextmanager
    def commit_lane(self, holder: Holder, *, timeout: float = 60.0) -> Iterator[None]:
        """Hold the workspace-wide commit lane for the body; waits up to timeout seconds for it. The lane is
        an flock (rule 1: a killed holder's goes with it), its file naming the holder while it is held."""
        deadline = self._clock.now() + timeout
        while (fd := try_lock(self._lane)) is None:
            if self._clock.now() >= deadline:
                current = self.lane_holder()
                raise StellaError(
                    f"the commit lane is still held by {current.describe() if current else 'another process'}"
                    f" after {timeout:g}s: try the commit again later"
                )
            self._clock.sleep(LANE_POLL_S)
        try:
            if (stale := _lane_file_holder(fd)) is not None:  # never cleared: its holder was killed
                log.warning(
                    "took over the commit lane from %s: that process is no longer running", stale.describe()
                )
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)
            yield
        finally:
            os.ftruncate(fd, 0)
            os.close(fd)

    @property
    def _lane(self) -> Path:
        return self.path.with_name("commit-lane.flock")  # not `*.lock`: those beside it are journal owners'

    def lane_holder(self) -> Holder | None:
        """Who holds the commit lane right now (None when free)."""
        if (fd := try_lock(self._lane)) is not None:
            os.close(fd)
            return None
        with open(self._lane, "rb") as file:
            return _lane_file_holder(file.fileno())

    def report_spans(self, run_id: str, attempt_id: int) -> None:
        """Say that this attempt's pipeline records a write span for every tool call that can write."""
        self._db.execute(
            "INSERT OR IGNORE INTO span_reporters (run_id, attempt_id) VALUES (?, ?)", (run_id, attempt_id)
        )

    def open_span(self, run_id: str, attempt_id: int, span: str, start_ns: int) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO write_spans (run_id, attempt_id, span, start_ns) VALUES (?, ?, ?, ?)",
            (run_id, attempt_id, span, start_ns),
        )

    def close_span(self, run_id: str, attempt_id: int, span: str, end_ns: int) -> None:
        self._db.execute(
            "UPDATE write_spans SET end_ns = ? WHERE run_id = ? AND attempt_id = ? AND span = ?"
            " AND end_ns IS NULL",
            (end_ns, run_id, attempt_id, span),
        )

    def write_spans(self, run_id: str, attempt_id: int) -> list[Span] | None:
        """The attempt's write spans in order, or None when its pipeline reports none."""
        key = (run_id, attempt_id)
        if not self._db.read("SELECT 1 FROM span_reporters WHERE run_id = ? AND attempt_id = ?", key):
            return None
        rows = self._db.read(
            "SELECT start_ns, end_ns FROM write_spans WHERE run_id = ? AND attempt_id = ? ORDER BY start_ns",
            key,
        )
        return [(int(row[0]), None if row[1] is None else int(row[1])) for row in rows]

    def drop_spans(self, run_id: str, attempt_id: int) -> None:
        with self._db.write() as conn:
            for table in ("span_reporters", "write_spans"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ? AND attempt_id = ?", (run_id, attempt_id))

    def release_attempt_if_held(self, run_id: str, attempt_id: int) -> int:
        """release_attempt, without the write lock when the attempt holds nothing (most attempts)."""
        held = self._db.read(
            "SELECT 1 FROM file_locks WHERE run_id = ? AND attempt_id = ? LIMIT 1", (run_id, attempt_id)
        )
        return self.release_attempt(run_id, attempt_id) if held else 0
