"""A FIFO where a worker's result or fragment should be (`$STELLA_PLAN_OUT`, the result file, the command's
report) is refused by name and never blocks the fleet: it opens only regular files, without blocking."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stellafleet.core.errors import PlanError
from stellafleet.pipelines.command import _read_report
from stellafleet.plan.fragment import FragmentRules, load_fragment
from stellafleet.plan.model import PlanTask
from stellafleet.run.executor import read_result


def _without_blocking(fifo: Path, call: Callable[[], Any]) -> Any:
    """call() on a thread; fails if it is still blocked after 10 s (released then by opening the writer)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a reader blocked in open() is let go by a writer
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"reading {fifo.name} blocked")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "planted"
    os.mkfifo(path)
    return path


def test_a_fragment_that_is_a_fifo_is_refused_by_name(fifo: Path) -> None:
    emitter = PlanTask("split", "p", "split", expands=True)
    rules = FragmentRules(frozenset(), depth=1, max_depth=3, emitted_before=0, max_emitted=10)
    with pytest.raises(PlanError) as raised:
        _without_blocking(fifo, lambda: load_fragment(fifo, emitter, rules))
    assert raised.value.problems == [
        'fragment of "split": not a regular file (a FIFO, a device or a socket): write a plan file'
    ]


def test_a_result_file_that_is_a_fifo_is_no_result(fifo: Path) -> None:
    assert _without_blocking(fifo, lambda: read_result(fifo)) is None


def test_a_commands_report_that_is_a_fifo_is_refused_by_name(fifo: Path) -> None:
    with pytest.raises(ValueError, match="STELLA_COMMAND_RESULT file is not a regular file"):
        _without_blocking(fifo, lambda: _read_report(fifo))
