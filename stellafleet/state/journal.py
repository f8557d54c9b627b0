"""The journal: what each running stella process does to git or the ledger, so the next command repairs what
a killed one left. An owner holds an flock while it has records: "is it alive" is "can I take its lock"."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.proc.flock import try_lock

log = logging.getLogger(__name__)

# kind -> its repair, "module:function(root, records) -> done", imported only when a record of that kind
# is to be repaired; in repair order (a killed commit's lane before a merge, whose repair needs the index).
REPAIRS = {
    "scratch": "stellafleet.git.lanejournal:repair_scratch",
    "commit": "stellafleet.git.lanejournal:repair",
    "check": "stellafleet.run.checking:repair",  # before a merge's: its check tree goes first
    "restack": "stellafleet.run.restack:repair",  # before a merge's: a half-restacked child is not taken
    "merge": "stellafleet.merge.journal:repair",
    "fleet": "stellafleet.run.salvaging:repair",
    "clean": "stellafleet.git.clean:repair",
}


class Busy(Exception):
    """An exclusive record (one stella merge per repository) that another process holds."""


@dataclass(frozen=True)
class Record:
    path: Path
    data: dict[str, Any]

    @property
    def written_at(self) -> float | None:
        with contextlib.suppress(OSError):
            return self.path.stat().st_mtime
        return None


class Owner:
    """This process in one journal directory: its lock, held while it has a record there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.name = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._fd: int | None = None
        self._records: set[str] = set()

    @property
    def lock(self) -> Path:
        return self.directory / f"{self.name}.lock"

    def write(self, name: str, kind: str, *, exclusive: bool = False, **fields: Any) -> Path:
        """Write record name (atomically); exclusive: Busy when another process has it."""
        path = self.directory / f"{name}.json"
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = try_lock(self.lock)  # a name no other process uses: never held
        tmp = self.directory / f"{name}.{self.name}.tmp"
        tmp.write_text(json.dumps({"kind": kind, "owner": self.name, "pid": os.getpid(), **fields}))
        if exclusive and name not in self._records:
            try:
                os.link(tmp, path)
            except FileExistsError:
                self._release_if_idle()
                raise Busy(name) from None
            finally:
                tmp.unlink()
        else:
            os.replace(tmp, path)
        self._records.add(name)
        return path

    def drop(self, name: str) -> None:
        if name in self._records:
            (self.directory / f"{name}.json").unlink(missing_ok=True)
            self._records.discard(name)
        self._release_if_idle()

    def _release_if_idle(self) -> None:
        if not self._records and self._fd is not None:
            self.lock.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


_owners: dict[Path, Owner] = {}
_acting: list[Owner] = []
_serial = itertools.count()


def owner(root: Path) -> Owner:
    """This process's owner in root's journal."""
    return owner_in(StatePaths(root).journal)


def owner_in(directory: Path) -> Owner:
    return _owners.setdefault(directory, Owner(directory))


@contextlib.contextmanager
def acting(root: Path, kind: str, **fields: Any) -> Iterator[Owner]:
    """A record of kind for the body; records made without a root (scratch directories) join it."""
    own = owner(root)
    name = f"{kind}-{own.name}-{next(_serial)}"
    own.write(name, kind, **fields)
    _acting.append(own)
    try:
        yield own
    finally:
        _acting.pop()
        own.drop(name)


def current() -> Owner | None:
    """The owner of the innermost `acting` of this process, if any."""
    return _acting[-1] if _acting else None


def read(path: Path) -> dict[str, Any] | None:
    """The record at path (empty when unreadable), None when there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    return data if isinstance(data, dict) else {}


def _say(line: str) -> None:
    print(f"stella: {line}", file=sys.stderr)


def recover(root: Path) -> None:
    """Repair what killed stella processes left in root's journal: a directory listing when it has none."""
    directory = StatePaths(root).journal
    try:
        names = os.listdir(directory)
    except OSError:
        return
    locks = {name[: -len(".lock")] for name in names if name.endswith(".lock")}
    held: dict[str, int] = {}
    try:
        for name in sorted(locks):
            if (fd := try_lock(directory / f"{name}.lock")) is not None:
                held[name] = fd
        if not held:
            return  # every owner lives (a record's owner lock only goes after its last record)
        records = _dead_records(directory, names, locks, held)
        order = list(REPAIRS)
        for kind in sorted(records, key=lambda k: order.index(k) if k in order else len(order)):
            _repair(root, kind, records[kind])
        left = {r.data.get("owner") for rs in records.values() for r in rs if r.path.exists()}
        for name in held.keys() - left:
            (directory / f"{name}.lock").unlink(missing_ok=True)
    finally:
        for fd in held.values():
            os.close(fd)


def _dead_records(
    directory: Path, names: list[str], locks: set[str], held: dict[str, int]
) -> dict[str, list[Record]]:
    """The records whose owner is gone (its lock taken now, or no lock at all), by kind."""
    found: dict[str, list[Record]] = {}
    for name in sorted(n for n in names if n.endswith(".json")):
        path = directory / name
        data = read(path)
        if data is None:
            continue
        who = data.get("owner")
        if not isinstance(who, str) or not isinstance(data.get("kind"), str):
            _say(f"{path} is not a journal record this stella can read: left alone")
            continue
        if who not in held and who in locks:
            continue  # its owner is alive
        if who not in held:  # its lock is gone: take it, so that two commands never repair it at once
            if (fd := try_lock(directory / f"{who}.lock")) is None:
                continue
            held[who] = fd
        if read(path) == data:  # still there, as read
            found.setdefault(str(data["kind"]), []).append(Record(path, data))
    for owner_name in held:
        for tmp in directory.glob(f"*.{owner_name}.tmp"):  # one killed as it wrote
            tmp.unlink(missing_ok=True)
    return found


def _repair(root: Path, kind: str, records: list[Record]) -> None:
    """The repair of kind for records; each is dropped once it says it is done."""
    target = REPAIRS.get(kind)
    if target is None:
        for record in records:
            _say(f"{record.path} is a journal record of a kind this stella does not know ({kind!r}): left")
        return
    module, function = target.split(":")
    try:
        done = getattr(importlib.import_module(module), function)(root, records)
    except (StellaError, OSError) as exc:
        log.warning("could not repair what a stopped stella process left (%s): %s", kind, exc)
        return
    if done:
        for record in records:
            if read(record.path) == record.data:  # not a new record of the same name
                record.path.unlink(missing_ok=True)


def recover_from(cwd: Path) -> None:
    """recover() for the repository whose state holds cwd (its nearest .stella/private), if any."""
    for place in (cwd, *cwd.parents):
        if StatePaths(place).journal.is_dir():
            recover(place)
            return
