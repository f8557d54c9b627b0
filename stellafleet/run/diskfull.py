"""A full disk during a run: the workers stopped, the room kept for this moment freed, what can be recorded
recorded, and one line that says what to do (exit 2), never "internal error" and never a run left running."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from stellafleet.core.errors import DiskFull, is_disk_full
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import RunStatus, Stop, StopReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.background import run_in_background
from stellafleet.state.ledger import Ledger

# What the run's last ledger writes need once the disk is full (a few WAL frames each), kept from the start
ROOM_BYTES = 1 << 20


class FullDisk:
    """One run's room on its disk and the first full disk its attempts met."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root, self.run_id = root, run_id
        self.room = StatePaths(root).private / f"room-{run_id}"
        self.seen: DiskFull | None = None

    def guard(
        self,
        execute: Callable[[PlanTask], bool],
        stop_run: Callable[[Stop], None],
        stop_workers: Callable[[], None],
    ) -> Callable[[PlanTask], bool]:
        """execute, where a full disk stops the run and its workers (anything else only fails the task)."""

        def guarded(task: PlanTask) -> bool:
            try:
                return execute(task)
            except Exception as exc:
                self.stopping(exc, stop_run, stop_workers)
                raise

        return guarded

    def run(self, ledger: Ledger, waves: Callable[[], object], *, on_interrupt: Callable[[], None]) -> None:
        """The waves in the background, the room kept; after a full disk, DiskFull once all is recorded."""
        self.keep_room()
        try:
            run_in_background(waves, on_interrupt=on_interrupt, name="stella-waves")
        finally:
            self.free_room()
        if self.seen is not None:
            raise self.record(ledger)

    def keep_room(self) -> None:
        """ROOM_BYTES taken now, freed when the disk fills (none if it is already too full to keep)."""
        try:
            with self.room.open("wb") as out:
                out.write(bytes(ROOM_BYTES))
        except OSError:
            self.free_room()

    def free_room(self) -> None:
        self.room.unlink(missing_ok=True)

    def stopping(
        self, exc: BaseException, stop_run: Callable[[Stop], None], stop_workers: Callable[[], None]
    ) -> bool:
        """Whether exc is a full disk; the first one stops the run and its workers, then frees the room."""
        if not is_disk_full(exc):
            return False
        if self.seen is None:
            path = exc.path if isinstance(exc, DiskFull) else getattr(exc, "filename", None) or self.root
            self.seen = DiskFull(path, self.run_id)
            stop_run(Stop(StopReason.DISK_FULL, str(self.seen)))
            stop_workers()  # nothing more writes, so what the room holds is the ledger's
            self.free_room()
        return True

    def record(self, ledger: Ledger) -> DiskFull:
        """What can be recorded (open attempts abandoned, unfinished tasks interrupted and waiting on
        `--resume`, the run interrupted with exit 2: as a stopped fleet's run is finalised); the error."""
        full = self.seen or DiskFull(self.root, self.run_id)
        with contextlib.suppress(DiskFull):
            ledger.abandon_run(self.run_id, str(full))
            ledger.runs.finish(self.run_id, RunStatus.INTERRUPTED, exit_code=full.exit_code, reason=str(full))
        return full
