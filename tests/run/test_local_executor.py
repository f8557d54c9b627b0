"""LocalExecutor behind the Executor seam: a started worker is waited on, stopped, or timed out."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from helpers.fleet import wait_for, worker_context, write_config
from helpers.spawn import ended_within

from stellafleet.core.status import AttemptEnd, AttemptOutcome, Stop, StopReason
from stellafleet.run.executor import Attempt, LocalExecutor


def test_a_worker_that_ends_by_itself_reports_its_result(tmp_path: Path, isolated_home: Path) -> None:
    write_config(tmp_path, run="echo all done")
    ctx = worker_context(tmp_path)
    end = LocalExecutor().start(Attempt(ctx, {**os.environ, **ctx.to_env()})).wait()
    assert end.stop is None and end.exit_code == 0
    assert end.outcome is AttemptOutcome.SUCCEEDED and end.summary == "all done"


def test_stop_from_another_thread_ends_the_wait_and_the_whole_tree(
    tmp_path: Path, isolated_home: Path
) -> None:
    # written whole, then renamed: the test never reads a half-written pid
    write_config(tmp_path, run="sleep 60 & echo $! > grandchild.tmp; mv grandchild.tmp grandchild; sleep 60")
    ctx = worker_context(tmp_path)
    execution = LocalExecutor(stop_grace_s=2.0).start(Attempt(ctx, {**os.environ, **ctx.to_env()}))
    ended: list[AttemptEnd] = []
    waiter = threading.Thread(target=lambda: ended.append(execution.wait()))
    waiter.start()
    wait_for(tmp_path / "grandchild")
    grandchild = int((tmp_path / "grandchild").read_text())
    execution.stop()
    waiter.join(30)
    assert not waiter.is_alive()
    (end,) = ended
    assert end.stop == Stop(StopReason.INTERRUPTED) and end.exit_code != 0
    assert ended_within(grandchild, 5.0), "the worker's background child outlived the stopped attempt"
    execution.stop()  # after the end: nothing left to stop, and no error


def test_a_worker_past_its_timeout_is_stopped(tmp_path: Path, isolated_home: Path) -> None:
    write_config(tmp_path, run="sleep 60")
    ctx = worker_context(tmp_path, timeout=0.5)
    end = LocalExecutor(stop_grace_s=2.0).start(Attempt(ctx, {**os.environ, **ctx.to_env()})).wait()
    assert end.stop == Stop(StopReason.TIMED_OUT, "timed out after 0.5s")
    assert end.exit_code is not None and end.exit_code != 0
