"""Host-wide leases: named locks and TCP ports, in one SQLite file every repository's stella on this machine
shares (`leases.db` in core/paths.py's host state directory). A lease's holder is a process named by its
pid and start time (proc/pids.py); the leases of a holder that died are reclaimed by the next command that
uses the store, except the ports of a worktree that still exists: they are the worktree's for its life.
All leases SQL lives here."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.clock import Clock, wall_ms
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import host_state_dir
from stellafleet.proc.flock import try_lock
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.state.sqlitefile import Database, Handle, Schema

PORT_VARS = ("STELLA_PORT", "STELLA_PORTS")  # a task's leased ports: the first, and all
LOCK_POLL_S = 0.05  # how often a task waiting for a lock asks again
DEFAULT_PORT_RANGE = "20000-29999"

_HOLDER_DDL = """
        token TEXT NOT NULL,
        repo TEXT NOT NULL,
        run_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_started REAL NOT NULL,"""
_V1 = (
    f"CREATE TABLE locks (name TEXT PRIMARY KEY,{_HOLDER_DDL} at_ms INTEGER NOT NULL)",
    "CREATE INDEX locks_by_token ON locks(token)",
    # who waits for which locks, oldest first (its id): a lock goes to no one while an older waiter wants it
    f"CREATE TABLE lock_waits (id INTEGER PRIMARY KEY AUTOINCREMENT, names_json TEXT NOT NULL,{_HOLDER_DDL}"
    " since_ms INTEGER NOT NULL, UNIQUE (token))",
    # worktree: the isolated task's worktree the port is leased to for its life (NULL: one attempt's)
    f"CREATE TABLE ports (port INTEGER PRIMARY KEY,{_HOLDER_DDL} worktree TEXT, at_ms INTEGER NOT NULL)",
    "CREATE INDEX ports_by_token ON ports(token)",
    "CREATE INDEX ports_by_worktree ON ports(worktree)",
)
LEASES_SCHEMA = Schema(label="lease store", application_id=0x53544C53, migrations=(_V1,))  # "STLS"
_COLUMNS = "token, repo, run_id, task_id, pid, pid_started"


def store_path() -> Path:
    return host_state_dir() / "leases.db"


def port_env(ports: Sequence[int]) -> dict[str, str]:
    """STELLA_PORT (the first) and STELLA_PORTS (all, space-separated); nothing without ports."""
    if not ports:
        return {}
    return dict(zip(PORT_VARS, (str(ports[0]), " ".join(str(port) for port in ports)), strict=True))


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease: one attempt (its token) of a task of a run in a repository, through one process."""

    token: str
    repo: str
    run_id: str
    task_id: str
    pid: int
    pid_started: float

    @classmethod
    def here(cls, token: str, repo: Path, run_id: str, task_id: str) -> LeaseHolder:
        """A holder for this process, stamped with its start time."""
        me = ProcessIdentity.of()
        assert me is not None, "this process runs"
        return cls(token, str(repo), run_id, task_id, me.pid, me.started_at)

    def is_alive(self) -> bool:
        return ProcessIdentity(self.pid, self.pid_started).is_alive()

    def describe(self, repo: Path | str | None = None, run_id: str | None = None) -> str:
        """`a`, with its run (and repository) when they are not the asker's."""
        if run_id == self.run_id:
            return self.task_id
        where = "" if repo is not None and str(repo) == self.repo else f" in {self.repo}"
        return f"{self.task_id} of run {self.run_id}{where}, pid {self.pid}"

    def values(self) -> tuple[Any, ...]:
        return (self.token, self.repo, self.run_id, self.task_id, self.pid, self.pid_started)


@dataclass(frozen=True)
class Blocked:
    """Why a task cannot take its locks yet: `lock` is held by `holder`, or wanted by an older waiter."""

    lock: str
    holder: LeaseHolder
    waiting: bool = False  # holder does not hold it yet: it waits for it, and waited longer


@dataclass(frozen=True)
class PortAsk:
    """Ports an attempt asks for: count of them from span; a worktree's are its own for its life."""

    count: int
    span: tuple[int, int]
    worktree: Path | None = None


def parse_range(text: str) -> tuple[int, int]:
    """`20000-29999` as (20000, 29999); ValueError with the reason."""
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"port_range {text!r} is not FIRST-LAST (such as {DEFAULT_PORT_RANGE!r})")
    first, last = int(low), int(high)
    if not 1024 <= first <= last <= 65535:
        raise ValueError(f"port_range {text!r} must lie within 1024-65535, its first port not after its last")
    return first, last


def bindable(port: int) -> bool:
    """Whether nothing on this machine holds port: TCP on every IPv4 and IPv6 address (as a server binds)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue  # no IPv6 here
            return False
    return True


def _holder(row: sqlite3.Row) -> LeaseHolder:
    return LeaseHolder(*(row[name] for name in ("token", "repo", "run_id", "task_id", "pid", "pid_started")))


class LeaseStore(Handle):
    """The host's lease store; safe to share between the threads of one process."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.path = db.path
        # every write under the directory's flock too: a process waits in the kernel, not in SQLite's backoff
        self._guard = db.path.with_name(db.path.name + ".lock")

    @classmethod
    def open(cls, path: Path | None = None) -> LeaseStore:
        """Open (creating atomically) the host's lease store (default: in the host state directory), and
        free what holders that died left: every command that opens it reclaims them."""
        store = cls(Database(path or store_path(), LEASES_SCHEMA, readonly=False, now_ms=wall_ms))
        store.reclaim()
        return store

    @classmethod
    def if_any(cls) -> LeaseStore | None:
        """The host's lease store when one was ever made (a command that only frees leases makes none)."""
        return cls.open() if store_path().exists() else None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        fd = try_lock(self._guard, wait=True)  # made beside the database, whose directory exists
        try:
            with self._db.write() as conn:
                yield conn
        finally:
            if fd is not None:
                os.close(fd)

    def _reclaim(self, conn: sqlite3.Connection) -> None:
        """The leases of every holder that died go (but a port whose worktree still exists)."""
        who = conn.execute(
            "SELECT DISTINCT pid, pid_started FROM locks UNION SELECT pid, pid_started FROM lock_waits"
            " UNION SELECT pid, pid_started FROM ports"
        ).fetchall()
        for pid, started in who:
            if not ProcessIdentity(pid, started).is_alive():
                self._forget(conn, pid, started)

    def _forget(self, conn: sqlite3.Connection, pid: int, started: float) -> None:
        """A dead holder's leases, but a port whose worktree still exists: it is never given away."""
        conn.execute("DELETE FROM locks WHERE pid = ? AND pid_started = ?", (pid, started))
        conn.execute("DELETE FROM lock_waits WHERE pid = ? AND pid_started = ?", (pid, started))
        for port, worktree in conn.execute(
            "SELECT port, worktree FROM ports WHERE pid = ? AND pid_started = ?", (pid, started)
        ).fetchall():
            if worktree is None or not Path(worktree).exists():
                conn.execute("DELETE FROM ports WHERE port = ?", (port,))

    def reclaim(self) -> None:
        """What dead holders left, freed now (opening the store does this first)."""
        with self._write() as conn:
            self._reclaim(conn)

    # --- locks ---

    def try_take(
        self, names: Sequence[str], holder: LeaseHolder, ports: PortAsk | None = None
    ) -> Blocked | list[int]:
        """Every lock in names for holder (or none), then its ports, in one transaction: the ports leased
        (none asked: []); else what blocks the locks (holder then waits in line: no one who asks later
        takes a lock it wants first). StellaError when the range has too few free ports."""
        wanted = sorted(set(names))
        asked = ports if ports is not None and ports.count else None
        # bound before the transaction, which keeps only those no one leased: the store's lock is held for
        # no socket calls unless these run short
        probed = _probe(asked.count + 2, *asked.span) if asked is not None else []
        with self._write() as conn:
            blocked = self._blocker(conn, wanted, holder) if wanted else None
            if blocked is not None:
                self._wait(conn, wanted, holder)
                return blocked
            now = self._db.now_ms()
            conn.executemany(
                f"INSERT OR REPLACE INTO locks (name, {_COLUMNS}, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(name, *holder.values(), now) for name in wanted],
            )
            conn.execute("DELETE FROM lock_waits WHERE token = ?", (holder.token,))
            return self._lease(conn, asked, holder, probed) if asked is not None else []

    def try_locks(self, names: Sequence[str], holder: LeaseHolder) -> Blocked | None:
        """Every lock in names for holder, or none: None when taken, else what blocks them."""
        taken = self.try_take(names, holder)
        return taken if isinstance(taken, Blocked) else None

    def _blocker(self, conn: sqlite3.Connection, wanted: list[str], holder: LeaseHolder) -> Blocked | None:
        """A live holder of one of wanted, or a live waiter for one that asked before holder; a dead one
        met on the way is forgotten (only the holders in the way are asked whether they live)."""
        while True:
            found = conn.execute(
                f"SELECT name, {_COLUMNS} FROM locks WHERE name IN (SELECT value FROM json_each(?))"
                " AND token != ? ORDER BY name",
                (json.dumps(wanted), holder.token),
            ).fetchone()
            if found is None:
                break
            if _holder(found).is_alive():
                return Blocked(found["name"], _holder(found))
            self._forget(conn, found["pid"], found["pid_started"])
        for row in conn.execute(
            f"SELECT names_json, {_COLUMNS} FROM lock_waits"
            " WHERE id < COALESCE((SELECT id FROM lock_waits WHERE token = ?), 1 << 62) ORDER BY id",
            (holder.token,),
        ).fetchall():
            common = sorted(set(json.loads(row["names_json"])) & set(wanted))
            if common and _holder(row).is_alive():
                return Blocked(common[0], _holder(row), waiting=True)
            if common:
                self._forget(conn, row["pid"], row["pid_started"])
        return None

    def _wait(self, conn: sqlite3.Connection, names: list[str], holder: LeaseHolder) -> None:
        conn.execute(
            f"INSERT OR IGNORE INTO lock_waits (names_json, {_COLUMNS}, since_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (json.dumps(names), *holder.values(), self._db.now_ms()),
        )

    def take(
        self,
        names: Sequence[str],
        holder: LeaseHolder,
        ports: PortAsk | None = None,
        *,
        clock: Clock,
        stop: threading.Event,
        on_wait: Callable[[Blocked], None] | None = None,
    ) -> list[int] | None:
        """try_take until the locks are free (polling on clock; on_wait told of each new blocker): the
        ports leased; None when stop was set first (then it holds none and waits no more)."""
        said: tuple[str, str] | None = None
        while isinstance(taken := self.try_take(names, holder, ports), Blocked):
            if stop.is_set():
                self.release(holder.token)
                return None
            if on_wait is not None and said != (taken.lock, taken.holder.token):
                said = (taken.lock, taken.holder.token)
                on_wait(taken)
            clock.sleep(LOCK_POLL_S)
        return taken

    # --- ports ---

    def lease_ports(
        self, count: int, port_range: tuple[int, int], holder: LeaseHolder, worktree: Path | None = None
    ) -> list[int]:
        """count ports for holder, as try_take leases them."""
        taken = self.try_take([], holder, PortAsk(count, port_range, worktree))
        assert not isinstance(taken, Blocked), "no lock asked"
        return taken

    def _lease(
        self, conn: sqlite3.Connection, ask: PortAsk, holder: LeaseHolder, probed: Sequence[int]
    ) -> list[int]:
        """ask.count ports for holder, each found free by binding it (probed: just now): a worktree's own
        ones again if it has them (then held by holder)."""
        (first, last), count = ask.span, ask.count
        place = None if ask.worktree is None else str(ask.worktree.resolve())
        if place is not None:
            mine = [
                int(row[0])
                for row in conn.execute("SELECT port FROM ports WHERE worktree = ? ORDER BY port", (place,))
            ]
            if len(mine) >= count:
                conn.execute(
                    "UPDATE ports SET token = ?, repo = ?, run_id = ?, task_id = ?, pid = ?,"
                    " pid_started = ? WHERE worktree = ?",
                    (*holder.values(), place),
                )
                return mine[:count]
            conn.execute("DELETE FROM ports WHERE worktree = ?", (place,))
        picked = _free_ports(conn, count, first, last, probed)
        if len(picked) < count:  # what dead holders left first, then anew
            self._reclaim(conn)
            picked = _free_ports(conn, count, first, last)
        if len(picked) < count:
            leased = conn.execute("SELECT COUNT(*) FROM ports").fetchone()[0]
            raise StellaError(
                f"no {count} free ports in {first}-{last} ({leased} leased on this machine): widen "
                "[resources] port_range, or run `stella clean` to release finished worktrees' ports"
            )
        now = self._db.now_ms()
        conn.executemany(
            f"INSERT INTO ports (port, {_COLUMNS}, worktree, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(port, *holder.values(), place, now) for port in picked],
        )
        return sorted(picked)  # in the order a worktree's are read back: STELLA_PORT stays its first

    def release(self, token: str) -> None:
        """An attempt's locks (and its place in line), and its ports unless a worktree holds them."""
        with self._write() as conn:
            conn.execute("DELETE FROM locks WHERE token = ?", (token,))
            conn.execute("DELETE FROM lock_waits WHERE token = ?", (token,))
            conn.execute("DELETE FROM ports WHERE token = ? AND worktree IS NULL", (token,))

    def ports_of(self, worktree: Path) -> list[int]:
        """The ports leased to a worktree (its teardown sees them)."""
        place = str(worktree.resolve())
        rows = self._db.read("SELECT port FROM ports WHERE worktree = ? ORDER BY port", (place,))
        return [int(row[0]) for row in rows]

    def release_worktree(self, worktree: Path) -> list[int]:
        """A removed worktree's ports (`stella clean`): the ports released."""
        place = str(worktree.resolve())
        with self._write() as conn:
            rows = conn.execute("SELECT port FROM ports WHERE worktree = ?", (place,)).fetchall()
            conn.execute("DELETE FROM ports WHERE worktree = ?", (place,))
        return [int(row[0]) for row in rows]

    def held(self) -> dict[str, list[dict[str, Any]]]:
        """What is held and awaited on this machine: locks, waits and ports, each with its holder."""
        return {
            "locks": self._db.rows(f"SELECT name, {_COLUMNS}, at_ms FROM locks ORDER BY name"),
            "waiting": self._db.rows(f"SELECT names_json, {_COLUMNS}, since_ms FROM lock_waits ORDER BY id"),
            "ports": self._db.rows(f"SELECT port, {_COLUMNS}, worktree, at_ms FROM ports ORDER BY port"),
        }


def _probe(count: int, first: int, last: int) -> list[int]:
    """Up to count random ports of first..last that bind now."""
    return [
        port for port in random.sample(range(first, last + 1), min(count, last - first + 1)) if bindable(port)
    ]


def _free_ports(
    conn: sqlite3.Connection, count: int, first: int, last: int, probed: Sequence[int] = ()
) -> list[int]:
    """count ports of first..last that no one leased and that bind: those of probed (bound just now) first,
    then from a random place (so a port just released, maybe in TIME_WAIT, is not the next one handed
    out)."""
    start = random.randint(first, last)
    picked: list[int] = []
    for port in itertools.chain(probed, range(start, last + 1), range(first, start)):
        leased = conn.execute("SELECT 1 FROM ports WHERE port = ?", (port,)).fetchone() is not None
        if not leased and port not in picked and (port in probed or bindable(port)):
            picked.append(port)
            if len(picked) == count:
                break
    return picked
