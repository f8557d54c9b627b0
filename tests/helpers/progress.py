"""A progress line for long test runs: every PROGRESS_EVERY seconds, how many tests are done of how many,
how many failed, and how long the run has taken. On with STELLA_TEST_PROGRESS=1 (`tools/dev.py test`
sets it); pytest's own dots and `[done/total]` counts go on around it."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

PROGRESS_EVERY = 20.0  # seconds


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    def __init__(self, config: pytest.Config, clock: Any = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.started = clock()
        self.last = self.started
        self.total = 0
        self.done = 0
        self.failed = 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without xdist
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.total = max(self.total, len(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        self.done += 1
        self.failed += report.failed
        now = self.clock()
        if now - self.last >= PROGRESS_EVERY:
            self.last = now
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write("\n" + self.line(now) + "\n")  # its own line, amid pytest's dots

    def line(self, now: float) -> str:
        of = f" of {self.total}" if self.total else ""
        failed = f", {self.failed} failed" if self.failed else ""
        return f"-- {self.done}{of} tests done{failed} after {_elapsed(now - self.started)}"


def register(config: pytest.Config) -> None:
    """The progress plugin on the process that reports (not on an xdist worker), when asked for."""
    if os.environ.get("STELLA_TEST_PROGRESS") == "1" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Progress(config), "stella-progress")
