"""An attempt ends with its whole process tree: nothing a worker started runs on after it ended, and a tree
that ignores SIGTERM is killed (SIGKILL) once the stop grace period is over."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
from helpers.fleet import by_id, install_pipeline, run_record, wait_for, worker_context, write_config
from helpers.repo import StellaRunner

from stellafleet.core.status import AttemptEnd, Stop, StopReason
from stellafleet.run.executor import Attempt, LocalExecutor

LATE_S = 60  # long past any attempt here, however loaded the machine
# The command leaves a background job that would write a file later, then ends (or kills its worker).
BACKGROUND = (
    f'(sleep {LATE_S}; echo late > "$MARKS/$STELLA_TASK_ID.late") >/dev/null 2>&1 & '
    'echo $! > "$MARKS/$STELLA_TASK_ID.bg"; '
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_what_a_worker_leaves_running_ends_with_its_attempt(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "exits"\nprompt = "p"\n\n[[tasks]]\nid = "killed"\nprompt = "p"\n')
    # The worker process is the command's parent ($PPID)
    write_config(
        git_repo,
        tasks={"exits": BACKGROUND + "echo finished", "killed": BACKGROUND + "kill -9 $PPID; sleep 5"},
    )
    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    tasks = by_id(run_record(git_repo)["tasks"])
    assert tasks["exits"]["status"] == "succeeded" and tasks["killed"]["status"] == "failed"
    for task in ("exits", "killed"):
        assert _gone(int((marks / f"{task}.bg").read_text())), f"{task}'s background job outlived its attempt"
    # the job that would write .late is gone, so no wait can make one appear
    assert sorted(p.name for p in marks.glob("*.late")) == []


STUBBORN = """\
import signal, time
from pathlib import Path
from stellafleet.pipelines.base import PipelineResult


class Stubborn:
    name = "stubborn"
    description = "ignores SIGTERM"

    def preflight(self, config):
        return None

    def version(self):
        return None

    def run(self, ctx, config, spend):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (ctx.root / "ready").write_text("")
        time.sleep(60)
        return PipelineResult(True, "never")
"""


def _stubborn_attempt(tmp_path: Path) -> Attempt:
    site = install_pipeline(tmp_path / "plugin", "stubborn", "stubborn_pipeline:Stubborn", STUBBORN)
    ctx = worker_context(tmp_path, pipeline="stubborn")
    return Attempt(ctx, {**os.environ, **ctx.to_env(), **site})


def _stop_after_ready(tmp_path: Path, executor: LocalExecutor) -> tuple[AttemptEnd, float]:
    execution = executor.start(_stubborn_attempt(tmp_path))
    ended: list[AttemptEnd] = []
    waiter = threading.Thread(target=lambda: ended.append(execution.wait()))
    waiter.start()
    wait_for(tmp_path / "ready", timeout=30)
    stopped = time.monotonic()
    execution.stop()
    waiter.join(30)
    assert not waiter.is_alive()
    return ended[0], time.monotonic() - stopped


def test_a_worker_ignoring_sigterm_is_killed_by_sigkill_after_the_grace_period(
    tmp_path: Path, isolated_home: Path
) -> None:
    end, took = _stop_after_ready(tmp_path, LocalExecutor(stop_grace_s=0.7))
    assert end.stop == Stop(StopReason.INTERRUPTED)
    assert end.exit_code == -signal.SIGKILL, end.error
    assert took >= 0.7
