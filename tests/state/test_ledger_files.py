"""Opening ledger files: atomic creation by racing processes, refusals that never write, migrations."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.needs import missing
from helpers.spawn import run_together

from stellafleet.core.errors import StellaError
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_schema import LEDGER_SCHEMA, MIGRATIONS
from stellafleet.state.sqlitefile import Schema, open_database
from stellafleet.testing.sample_ledger import add_run


def _open_and_record(path: str, n: int, barrier: object, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        with Ledger.open(Path(path)) as ledger:
            add_run(ledger, f"r-{n}", base_ref="HEAD", argv=[], root="/", pid=n)
        results.put((n, "ok"))  # type: ignore[attr-defined]
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put((n, f"{type(exc).__name__}: {exc}"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("start", ["missing", "missing again", "empty file"])
def test_eight_processes_opening_a_missing_ledger_at_once_all_get_the_same_one(
    tmp_path: Path, start: str
) -> None:
    db = tmp_path / "private" / "fleet.db"
    if start == "empty file":
        db.parent.mkdir()
        db.touch()
    outcomes = dict(run_together(_open_and_record, lambda n: (str(db), n), 8, timeout=60))
    assert outcomes == {n: "ok" for n in range(8)}
    with Ledger.open(db, readonly=True) as ledger:
        assert ledger.runs.count() == 8
    leftovers = [
        p.name for p in db.parent.iterdir() if p.name not in ("fleet.db", "fleet.db-wal", "fleet.db-shm")
    ]
    assert leftovers == []


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_text_file_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    db.write_text("my notes, not a database\n" * 100)
    before = _snapshot(tmp_path)
    for readonly in (False, True):
        with pytest.raises(StellaError, match=r"fleet.db is not a fleet ledger .*leaves it untouched"):
            Ledger.open(db, readonly=readonly)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_an_unrelated_sqlite_database_is_refused_and_left_byte_identical(
    tmp_path: Path, journal: str
) -> None:
    db = tmp_path / "fleet.db"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("CREATE TABLE runs (x)")  # even a table of the same name does not make it a ledger
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = _snapshot(tmp_path)
    for readonly in (False, True):
        with pytest.raises(
            StellaError, match=r"is a SQLite database but not a fleet ledger \(tables: notes, runs\)"
        ):
            Ledger.open(db, readonly=readonly)
    assert db.read_bytes() == before["fleet.db"]
    assert _snapshot(tmp_path) == before


def test_a_ledger_from_a_newer_stella_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    Ledger.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LEDGER_SCHEMA.version + 1}")
    conn.close()
    before = _snapshot(tmp_path)
    for readonly in (False, True):
        with pytest.raises(
            StellaError,
            match=rf"schema version {LEDGER_SCHEMA.version + 1}, newer than this stella understands "
            rf"\({LEDGER_SCHEMA.version}\): upgrade",
        ):
            Ledger.open(db, readonly=readonly)
    assert _snapshot(tmp_path) == before


def test_an_empty_file_becomes_a_ledger(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    db.touch()
    with pytest.raises(StellaError, match="is empty"):
        Ledger.open(db, readonly=True)
    with Ledger.open(db) as ledger:
        assert ledger.runs.count() == 0
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_read_only_open_needs_an_existing_ledger_and_never_writes(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with pytest.raises(StellaError, match="no fleet ledger at"):
        Ledger.open(db, readonly=True)
    assert not db.exists()
    Ledger.open(db).close()
    with Ledger.open(db, readonly=True) as ledger, pytest.raises(StellaError, match="opened read-only"):
        ledger.runs.finish("r", "failed", exit_code=1)


def test_read_only_reader_works_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        add_run(ledger, "r-committed", base_ref="HEAD", argv=[], root="/", pid=1)
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sqlite3, sys
            conn = sqlite3.connect({str(db)!r}, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO runs (id, created_at_ms) VALUES ('r-uncommitted', 9)")
            print("holding", flush=True)
            sys.stdin.readline()
            conn.execute("COMMIT")
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "holding"
        with Ledger.open(db, readonly=True) as reader:
            assert [r["id"] for r in reader.runs.page()] == ["r-committed"]
            assert reader.runs.resolve("latest") == "r-committed"
    finally:
        assert writer.stdin is not None
        writer.stdin.write("\n")
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0
    with Ledger.open(db, readonly=True) as reader:
        assert reader.runs.count() == 2


def test_forward_migrations_run_once_and_keep_the_data(tmp_path: Path) -> None:
    db = tmp_path / "thing.db"
    v1 = Schema("test store", 0x7E57, (("CREATE TABLE items (name TEXT)",),))
    conn = open_database(db, v1)
    conn.execute("INSERT INTO items VALUES ('kept')")
    conn.close()
    v2 = Schema(
        "test store",
        0x7E57,
        (
            *v1.migrations,
            ("ALTER TABLE items ADD COLUMN size INTEGER NOT NULL DEFAULT 0", "CREATE INDEX i ON items(size)"),
        ),
    )
    reader = open_database(db, v2, readonly=True)  # `stella runs` first after an upgrade: it upgrades
    assert reader.execute("PRAGMA user_version").fetchone()[0] == 2
    assert [tuple(r) for r in reader.execute("SELECT name, size FROM items")] == [("kept", 0)]
    reader.close()
    for _ in range(2):
        conn = open_database(db, v2)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert [tuple(r) for r in conn.execute("SELECT name, size FROM items")] == [("kept", 0)]
        conn.close()
    with pytest.raises(StellaError, match=r"schema version 2, newer than this stella understands \(1\)"):
        open_database(db, v1)
    with pytest.raises(StellaError, match="not a fleet ledger"):
        Ledger.open(db)


def test_a_version_1_ledger_is_upgraded_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    v1 = Schema(LEDGER_SCHEMA.label, LEDGER_SCHEMA.application_id, MIGRATIONS[:1])
    conn = open_database(db, v1)
    conn.execute("INSERT INTO runs (id, created_at_ms) VALUES ('r-old', 1)")
    conn.execute("INSERT INTO attempts (run_id, task_id, started_at_ms, pid) VALUES ('r-old', 't', 2, 7)")
    conn.close()
    with Ledger.open(db) as ledger:
        assert ledger.runs.resolve("latest") == "r-old"
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LEDGER_SCHEMA.version
    row = conn.execute("SELECT schedule, resumed_from FROM runs WHERE id = 'r-old'").fetchone()
    assert row == (None, None)
    # a worker recorded before its start time was: its attempt's start stands in for it
    assert conn.execute("SELECT node, reason, pid_started_ms FROM attempts").fetchone() == (None, None, 2)
    assert conn.execute("SELECT count(*) FROM merges").fetchone()[0] == 0
    conn.close()


def _posix_locks_on(path: Path) -> list[tuple[str, str, str]]:
    """This process's POSIX locks on path's inode, as the kernel lists them: (mode, start, end), sorted.

    /proc/locks is one table for the whole machine: its line numbers shift whenever any other process
    (another test run in parallel) takes or drops a lock, so only the lock's own fields are compared."""
    inode = str(os.stat(path).st_ino)
    pid = str(os.getpid())
    locks = []
    with open("/proc/locks") as fh:
        for line in fh:
            fields = line.split()
            if "->" in fields or len(fields) < 8:
                continue  # a process waiting for a lock, not one holding it
            _number, kind, _advisory, mode, holder, where, start, end = fields[:8]
            if kind == "POSIX" and holder == pid and where.rsplit(":", 1)[-1] == inode:
                locks.append((mode, start, end))
    return sorted(locks)


def test_opening_the_ledger_again_keeps_the_locks_of_a_live_connection(tmp_path: Path) -> None:
    if not Path("/proc/locks").exists():
        missing("needs Linux's /proc/locks")
    # A plain open()/close() of the file drops every POSIX lock the process holds on it, the live
    # connection's included; another process may then checkpoint or reset the WAL under it (a fleet's
    # live display, which re-opens the ledger read-only, once made a worker miss its own attempt row).
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        ledger.runs.latest_id()
        held = _posix_locks_on(db)
        assert held, "a WAL-mode connection holds a shared lock on the database file"
        for readonly in (True, False):
            with Ledger.open(db, readonly=readonly) as again:
                again.runs.latest_id()
            assert _posix_locks_on(db) == held


def test_a_ledger_sqlite_cannot_open_is_not_called_foreign(tmp_path: Path) -> None:
    # A WAL file SQLite cannot create (here a dangling symlink; on a read-only directory the same error)
    # used to be reported as "not a fleet ledger ... move it away": advice that would lose the history.
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        add_run(ledger, "r-1", base_ref="HEAD", argv=[], root="/", pid=1)
    Path(f"{db}-wal").symlink_to(tmp_path / "missing-dir" / "wal")
    before = db.read_bytes()

    with pytest.raises(StellaError) as caught:
        Ledger.open(db, readonly=True)

    message = str(caught.value)
    assert "cannot open the fleet ledger" in message and "move it away" not in message, message
    assert db.read_bytes() == before


def test_a_ledger_that_cannot_be_created_is_a_stella_error(tmp_path: Path) -> None:
    # A read-only directory or a file where the directory should be was an OSError: "internal error".
    blocker = tmp_path / "private"
    blocker.write_text("not a directory\n")

    with pytest.raises(StellaError) as caught:
        Ledger.open(blocker / "fleet.db")

    assert "cannot create the fleet ledger" in str(caught.value) and str(blocker) in str(caught.value)
    assert blocker.read_text() == "not a directory\n"
