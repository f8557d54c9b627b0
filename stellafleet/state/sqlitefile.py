"""Opening stella's own SQLite files safely: created whole, a foreign or newer file refused, WAL mode."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from stellafleet.core.errors import DiskFull, StellaError, is_disk_full
from stellafleet.proc.flock import locked

# Long enough that a busy fleet never surfaces "database is locked"; writers hold the lock for microseconds.
BUSY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Schema:
    """A database file's application id and migrations (``migrations[n]``: user_version n to n + 1)."""

    label: str  # for messages: "fleet ledger", "claim store"
    application_id: int
    migrations: tuple[tuple[str, ...], ...]

    @property
    def version(self) -> int:
        return len(self.migrations)


def connect(path: Path, *, readonly: bool, immutable: bool = False) -> sqlite3.Connection:
    """A connection to an existing file in autocommit mode; ``immutable``: no locks, no trace."""
    mode = "ro" if readonly or immutable else "rw"
    uri = f"file:{quote(str(path.resolve()))}?mode={mode}" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(
        uri,
        uri=True,
        timeout=BUSY_TIMEOUT_S,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.row_factory = sqlite3.Row
    return conn


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One short ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front, so it never deadlocks."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Database:
    """One open connection to a stella database, shared by one process's threads."""

    def __init__(self, path: Path, schema: Schema, *, readonly: bool, now_ms: Callable[[], int]) -> None:
        self.conn = open_database(path, schema, readonly=readonly)
        self.path, self.label, self.readonly, self.now_ms = Path(path), schema.label, readonly, now_ms
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self.conn.execute(sql, tuple(params)).fetchall()

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self.read(sql, params)]

    def row(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        """One statement in a write transaction of its own."""
        with self.write() as conn:
            return conn.execute(sql, tuple(params))

    def insert(self, sql: str, params: Iterable[Any] = ()) -> int:
        """execute() of an INSERT: the new row's id."""
        row_id = self.execute(sql, params).lastrowid
        assert row_id is not None
        return int(row_id)

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StellaError(f"the {self.label} at {self.path} was opened read-only")
        try:
            with self._lock, write_transaction(self.conn) as conn:
                yield conn
        except sqlite3.OperationalError as exc:  # a full disk is the user's to free, not a bug
            if is_disk_full(exc):
                raise DiskFull(self.path) from exc
            raise


class Table:
    """The reads and writes of one table (or a few) on a Database."""

    def __init__(self, db: Database) -> None:
        self._db = db


class Handle(Table):
    """A file's whole interface on its Database: closing it (or leaving its `with`) closes the database."""

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_database(path: Path, schema: Schema, *, readonly: bool = False) -> sqlite3.Connection:
    """Open (and unless readonly, create or migrate) a stella database file; StellaError if it is not one."""
    path = Path(path)
    if readonly:
        if not path.exists():
            raise StellaError(f"no {schema.label} at {path}: nothing has been recorded there yet")
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():  # an empty one (left by `touch`, say): _initialise_empty builds it
                with locked(path.parent):  # its directory's flock: one creator at a time, no lock file
                    if not path.exists():
                        _create_atomically(path, schema)
        except OSError as exc:  # a read-only directory, a file where the directory should be, a full disk
            raise StellaError(
                f"cannot create the {schema.label} at {path}: {exc.strerror or exc}; "
                f"make {path.parent} a writable directory and run again"
            ) from None
    _precheck(path, schema)
    try:
        conn = connect(path, readonly=readonly)
    except sqlite3.Error as exc:
        raise StellaError(f"cannot open the {schema.label} at {path}: {exc}") from None
    try:
        _check_and_migrate(conn, path, schema, readonly=readonly)
    except BaseException:
        conn.close()
        raise
    return conn


def _create_atomically(path: Path, schema: Schema) -> None:
    """Build the whole schema in a private file, then link it into place (``os.link`` never replaces)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = connect(tmp, readonly=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            with write_transaction(conn):
                _apply_migrations(conn, schema, 0)
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first; theirs is as good as ours
        except OSError:
            # No hard links: create an empty file exclusively; _check_and_migrate initialises it.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _apply_migrations(conn: sqlite3.Connection, schema: Schema, current: int) -> None:
    for statements in schema.migrations[current:]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {int(schema.application_id)}")
    conn.execute(f"PRAGMA user_version = {int(schema.version)}")


_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"


def _identity(conn: sqlite3.Connection) -> tuple[int, int, list[str]]:
    """(application_id, user_version, tables), read in one transaction: read one by one, a file another
    process was building read as tables without an id, a foreign database."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [row[0] for row in conn.execute(_TABLES)]
    finally:
        if own:
            conn.execute("COMMIT")
    return int(application_id), int(version), tables


def _precheck(path: Path, schema: Schema) -> None:
    """Refuse a foreign or newer file before opening it, read through SQLite (a plain open() drops locks)."""
    if path.stat().st_size == 0 or Path(f"{path}-wal").exists():
        return  # empty (may become ours), or in use in WAL mode: the normal open judges it
    try:
        conn = connect(path, readonly=True, immutable=True)
        try:
            application_id, version, tables = _identity(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise _not_a_database(path, schema, exc) from None
    _refuse_foreign(path, schema, application_id, version, tables)


# SQLite's primary result codes for "could not get at the file" (as opposed to "this is not a database")
_ACCESS_ERRORS = {3, 8, 14}  # SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN


def _not_a_database(path: Path, schema: Schema, exc: Exception | str) -> StellaError:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _ACCESS_ERRORS:
        return StellaError(
            f"cannot open the {schema.label} at {path} ({exc}): check that the file, its -wal and -shm files "
            "and their directory are readable and writable"
        )
    return StellaError(
        f"{path} is not a {schema.label} ({exc}); stella leaves it untouched: move it away and run again"
    )


def _refuse_foreign(path: Path, schema: Schema, application_id: int, version: int, tables: list[str]) -> None:
    if application_id == 0 and version == 0 and not tables:
        return  # empty: may become ours
    if application_id != schema.application_id:
        listed = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
        raise StellaError(
            f"{path} is a SQLite database but not a {schema.label} (tables: {listed or 'none'}); "
            "stella leaves it untouched: move it away and run again"
        )
    if version > schema.version:
        raise StellaError(
            f"the {schema.label} at {path} has schema version {version}, newer than this stella understands "
            f"({schema.version}): upgrade stellafleet to use it"
        )


def _check_and_migrate(conn: sqlite3.Connection, path: Path, schema: Schema, *, readonly: bool) -> None:
    try:
        application_id, version, tables = _identity(conn)
    except sqlite3.DatabaseError as exc:
        raise _not_a_database(path, schema, exc) from None
    if application_id == 0 and version == 0 and not tables:
        if readonly:
            raise StellaError(f"the {schema.label} at {path} is empty: nothing has been recorded there yet")
        _initialise_empty(conn, path, schema)
        return
    _refuse_foreign(path, schema, application_id, version, tables)
    if version < schema.version and readonly:
        _upgrade_for_reading(path, schema, version)
    elif version < schema.version:
        _upgrade(conn, schema)
    if not readonly:
        _tune(conn, path)


def _upgrade(conn: sqlite3.Connection, schema: Schema) -> None:
    with write_transaction(conn):
        _, current, _ = _identity(conn)  # another process may have migrated it meanwhile
        if current < schema.version:
            _apply_migrations(conn, schema, current)


def _upgrade_for_reading(path: Path, schema: Schema, version: int) -> None:
    """A reader of an older file (`stella runs` first after an upgrade) upgrades it as a writer would: the
    migrations only add, each all-or-nothing. A file it cannot write stays as it is, with one line."""
    try:
        writer = connect(path, readonly=False)
        try:
            _upgrade(writer, schema)
            _tune(writer, path)
        finally:
            writer.close()
    except sqlite3.Error as exc:
        raise StellaError(
            f"the {schema.label} at {path} has the older schema version {version} and cannot be upgraded "
            f"here ({exc}): run a stella command that writes (such as `stella fleet`) where it is writable"
        ) from None


def _initialise_empty(conn: sqlite3.Connection, path: Path, schema: Schema) -> None:
    """An existing but empty SQLite file (say, left by `touch`) holds nothing to lose: build the schema."""
    _tune(conn, path)  # WAL before the first write
    with write_transaction(conn):
        application_id, version, tables = _identity(conn)
        if application_id == 0 and version == 0 and not tables:
            _apply_migrations(conn, schema, 0)
    _check_and_migrate(conn, path, schema, readonly=False)


def _tune(conn: sqlite3.Connection, path: Path) -> None:
    # Under the directory lock: two connections switching one file to WAL at once can get "database is
    # locked" without SQLite's busy wait (its deadlock guard).
    if not _is_wal(conn):
        with locked(path.parent):
            if not _is_wal(conn):
                conn.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL loses no committed data on a process crash and spares an fsync per commit.
    conn.execute("PRAGMA synchronous=NORMAL")


def _is_wal(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal")
