"""The one background runner: work in a thread while the calling thread only waits (and takes the signals)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_background(work: Callable[[], object], *, on_interrupt: Callable[[], None], name: str) -> None:
    """work() in a thread; what it raised is raised here. Ctrl-C while waiting calls on_interrupt (which makes
    work end: its workers stopped), waits for work to end (what it records is recorded), then is raised on."""
    errors: list[BaseException] = []
    # an Event, not Thread.join: after Ctrl-C interrupted a join, the next join can return while the
    # thread still runs
    finished = threading.Event()

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # handed back to the waiting thread below
            errors.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
        while not finished.wait(0.5):
            pass
    except KeyboardInterrupt:
        on_interrupt()
        if thread.ident is not None:  # it started
            finished.wait()
        raise
    if errors:
        raise errors[0]
