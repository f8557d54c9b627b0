"""The run's signal handling: Ctrl-C once launches nothing more; twice, or SIGTERM or SIGHUP, stops the
workers."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from stellafleet.core.status import Stop, StopReason
from stellafleet.core.words import plural
from stellafleet.run.events import Emit, Notice


@dataclass
class Interrupts:
    """Ctrl-C once: launch nothing more and let running workers finish (unless the run stops them on the
    first). Twice (or SIGTERM, SIGHUP): stop their process trees."""

    request_stop: Callable[[Stop], None]
    stop_workers: Callable[[], None]
    running: Callable[[], Sequence[str]]
    emit: Emit
    stop_on_first: bool = False
    count: int = 0

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1
        running = plural(len(self.running()), "running worker")
        self.request_stop(Stop(StopReason.INTERRUPTED))
        if self.count == 1 and signum == signal.SIGINT and not self.stop_on_first:
            self.emit(
                Notice(
                    f"interrupt: launching nothing more; waiting for {running}; "
                    "press Ctrl-C again to stop them"
                )
            )
            return
        self.stop_workers()
        self.emit(Notice(f"interrupt: stopping {running}"))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # SIGHUP (the terminal closed) is a stop like SIGTERM, not a kill that orphans the run's workers
        stops = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
        previous = {signum: signal.signal(signum, self.handle) for signum in stops}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
