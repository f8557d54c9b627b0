"""The hung-worker watchdog: a worker that shows no progress for `[fleet] idle_timeout` is stopped.
Progress is CPU time beyond a trickle (a hung CLI still wakes now and then), output, or spend."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.clock import Clock, SystemClock, wall_ms
from stellafleet.core.workercontext import WorkerContext
from stellafleet.proc.tree import tree_cpu_seconds
from stellafleet.run.executor import Execution
from stellafleet.state.ledger import Ledger

CPU_TRICKLE_S = 0.05  # CPU seconds that are never progress on their own (timers, a poll loop)
CPU_BUSY_SHARE = 0.01  # ... nor is less than 1% of a core since the last progress
MAX_INTERVAL_S = 5.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class Watched:
    """One running attempt as the watchdog last saw it."""

    context: WorkerContext
    execution: Execution
    progress_at: float  # clock time of the last progress
    progress_wall_ms: int
    cpu: float | None  # at the last progress
    output: int  # bytes of log + transcript
    spend_ms: int | None
    output_wall_ms: int | None = None  # when its output last grew (None: not since it started)
    stalled: str | None = None  # the evidence, once stopped

    @property
    def attempt(self) -> int:
        return self.context.attempt_id

    def output_size(self) -> int:
        return _size(self.context.log_path) + _size(self.context.transcript_path)


class Watchdog:
    """Watches the running attempts of one run; `check()` is one look, `watching` a thread of them."""

    def __init__(
        self,
        idle_timeout_s: float,
        ledger: Ledger,
        *,
        clock: Clock | None = None,
        cpu_of: Callable[[int], float | None] = tree_cpu_seconds,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.ledger = ledger
        self.clock = clock or SystemClock()
        self._cpu_of = cpu_of
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._watched: dict[int, Watched] = {}

    def watch(self, context: WorkerContext, execution: Execution) -> None:
        """Start watching a started worker; not one with no local process (pid None), whose CPU time cannot
        be seen: silence alone is no proof of a hang."""
        if execution.pid is None:
            return
        entry = Watched(context, execution, self.clock.now(), self._now_ms(), 0.0, 0, None)
        entry.output = entry.output_size()
        with self._lock:
            self._watched[entry.attempt] = entry

    def forget(self, attempt_id: int) -> str | None:
        """Stop watching an attempt whose worker has ended; the evidence if the watchdog stopped it."""
        with self._lock:
            entry = self._watched.pop(attempt_id, None)
        return None if entry is None else entry.stalled

    def check(self) -> None:
        """One look at every watched worker: record progress, stop the ones idle for too long."""
        with self._lock:
            entries = [entry for entry in self._watched.values() if entry.stalled is None]
        for entry in entries:
            self._look(entry)

    def _look(self, entry: Watched) -> None:
        now = self.clock.now()
        idle = now - entry.progress_at
        pid, output = entry.execution.pid, entry.output_size()
        cpu = None if pid is None else self._cpu_of(pid)
        spend_ms = self.ledger.spend.last_ms(entry.attempt)
        busy = (
            cpu is not None
            and entry.cpu is not None
            and abs(cpu - entry.cpu) > max(CPU_TRICKLE_S, CPU_BUSY_SHARE * idle)
        )
        if busy or output != entry.output or spend_ms != entry.spend_ms:
            entry.progress_at, entry.progress_wall_ms = now, self._now_ms()
            if output != entry.output:
                entry.output_wall_ms = entry.progress_wall_ms
            entry.cpu = cpu if cpu is not None else entry.cpu
            entry.output, entry.spend_ms = output, spend_ms
            self.ledger.attempts.set_progress(entry.attempt, entry.progress_wall_ms)
        elif idle >= self.idle_timeout_s:
            entry.stalled = self._evidence(entry, idle, cpu)
            entry.execution.stop()

    def _evidence(self, entry: Watched, idle: float, cpu: float | None) -> str:
        cpu_text = "CPU time unknown" if cpu is None else f"{cpu:.2f} CPU seconds in all"
        if entry.output_wall_ms is None:
            output = f"no output since it started ({entry.output} bytes of log)"
        else:
            at = time.strftime("%H:%M:%S", time.localtime(entry.output_wall_ms / 1000))
            output = f"last output at {at} ({entry.output} bytes of log)"
        return (
            f"stalled: idle for {idle:.0f}s, no CPU time, output or spend "
            f"(idle_timeout {self.idle_timeout_s:g}s); {cpu_text}; {output}; stopped"
        )


@contextlib.contextmanager
def watching(idle_timeout_s: float, ledger: Ledger) -> Iterator[Watchdog | None]:
    """A running watchdog for the run's attempts (None when idle_timeout is 0: no watchdog)."""
    if idle_timeout_s <= 0:
        yield None
        return
    watchdog, done = Watchdog(idle_timeout_s, ledger), threading.Event()

    def loop() -> None:
        while not done.wait(min(max(idle_timeout_s / 5, 0.05), MAX_INTERVAL_S)):
            with contextlib.suppress(Exception):  # a busy ledger or a vanished process: look again next time
                watchdog.check()

    threading.Thread(target=loop, name="stella-watchdog", daemon=True).start()
    try:
        yield watchdog
    finally:
        done.set()
