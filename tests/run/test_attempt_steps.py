"""The dispatcher runs an attempt's steps in order and releases every admitted one in reverse, whatever
failed, with the ledger consistent and the claims free (a real worker process, ledger and claim store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fleet import RUN, run_of_one_task, write_config
from helpers.repo import git

from stellafleet.core.config import load_config
from stellafleet.core.errors import DiskFull
from stellafleet.core.status import AttemptEnd, FollowUpReason, Stop, StopReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.events import SkipTask
from stellafleet.run.executor import Execution, LocalExecutor
from stellafleet.run.serve import Server, TaskFailed
from stellafleet.run.steps import AttemptState, AttemptStep, FollowUp, Request, RunSettings
from stellafleet.run.steps.claims import Claims
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

TASK = PlanTask("t1", "do it", "a task", claims=("x.txt",))


class Recorder(AttemptStep):
    """Notes each hook it is called for; `fail` names the hook that raises."""

    def __init__(self, name: str, calls: list[str], fail: str | None = None) -> None:
        self.name, self.calls, self.fail = name, calls, fail

    def _called(self, hook: str) -> None:
        self.calls.append(f"{self.name}.{hook}")
        if hook == self.fail == "admit":
            raise SkipTask(Stop(StopReason.SPEND_LIMIT, "no guard left"))
        if hook == self.fail:
            raise RuntimeError(f"{self.name} broke in {hook}")

    def admit(self, attempt: AttemptState) -> None:
        self._called("admit")

    def before_start(self, attempt: AttemptState) -> None:
        self._called("before_start")

    def started(self, attempt: AttemptState, execution: Execution) -> None:
        self._called("started")

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        self._called("ended")
        return end

    def released(self, attempt: AttemptState) -> None:
        self._called("released")


@pytest.fixture
def parts(git_repo: Path) -> Iterator[tuple[Path, Ledger, ClaimStore]]:
    write_config(git_repo, run="true")
    with run_of_one_task(git_repo, TASK) as opened:
        yield opened


def run_task(parts: tuple[Path, Ledger, ClaimStore], *steps: AttemptStep) -> None:
    root, ledger, store = parts
    head = git("rev-parse", "HEAD", cwd=root).strip()
    settings = RunSettings(root, RUN, head, default_pipeline="command", config=load_config(root))
    executor = LocalExecutor()
    try:
        dispatcher = Dispatcher(settings, ledger, executor, lambda event: None, [Claims(store, root), *steps])
        Server(dispatcher).execute(TASK)
    finally:
        executor.close()


def test_a_step_failing_as_the_attempt_ends_fails_it_and_every_step_is_released(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    calls: list[str] = []
    with pytest.raises(TaskFailed, match="internal error: RuntimeError: b broke in ended"):
        run_task(parts, Recorder("a", calls), Recorder("b", calls, fail="ended"))
    hooks = ["admit", "before_start", "started", "ended"]
    assert calls == [f"{name}.{hook}" for hook in hooks for name in "ab"] + ["b.released", "a.released"]
    _, ledger, store = parts
    record = ledger.get_run(RUN)
    [attempt] = record["attempts"]
    assert attempt["outcome"] == "failed" and record["tasks"][0]["status"] == "failed"
    assert store.paths_of_attempt(RUN, attempt["id"]) == []


def test_a_step_failing_on_release_leaves_the_others_released_and_the_attempt_recorded(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="b broke in released"):
        run_task(parts, Recorder("a", calls), Recorder("b", calls, fail="released"))
    assert calls[-2:] == ["b.released", "a.released"]
    _, ledger, store = parts
    [attempt] = ledger.get_run(RUN)["attempts"]
    assert attempt["outcome"] == "succeeded" and attempt["finished_at_ms"] is not None
    assert store.paths_of_attempt(RUN, attempt["id"]) == []


def test_a_step_refusing_admission_skips_the_task_and_releases_the_steps_before_it(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    calls: list[str] = []
    with pytest.raises(SkipTask, match="no guard left"):
        run_task(parts, Recorder("a", calls), Recorder("b", calls, fail="admit"), Recorder("c", calls))
    assert calls == ["a.admit", "b.admit", "a.released"]
    _, ledger, _ = parts
    assert ledger.get_run(RUN)["attempts"] == []


class FullDiskStep(AttemptStep):
    def before_start(self, attempt: AttemptState) -> None:
        raise DiskFull("/repo/.stella/worktrees", RUN)


def test_a_step_meeting_a_full_disk_fails_the_attempt_with_the_disk_full_words_alone(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    said = f"disk full at /repo/.stella/worktrees: free space, then stella fleet --resume {RUN}"
    with pytest.raises(TaskFailed) as failed:
        run_task(parts, FullDiskStep())
    assert str(failed.value).endswith(said) and "could not start" not in str(failed.value)
    [attempt] = parts[1].get_run(RUN)["attempts"]
    assert attempt["error"] == said


class TakesUpRequest(AttemptStep):
    """Takes up a request as it admits the attempt (as Park takes up an earlier run's answer)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def admit(self, attempt: AttemptState) -> None:
        attempt.request = Request(1, FollowUp(FollowUpReason.ANSWER, "the answer: use sqlite"))

    def before_start(self, attempt: AttemptState) -> None:
        self.prompts.append(attempt.ctx.prompt)


def test_a_request_a_step_took_up_as_it_admitted_the_attempt_ends_the_workers_prompt_once(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    step = TakesUpRequest()
    run_task(parts, step)
    assert step.prompts == ["do it\n\n---\nthe answer: use sqlite"]
