"""Follow-ups are requests: what a step asks for as its attempt is released becomes a ledger request, taken
exactly once and served by the next attempt (its context in the prompt, the reason on the attempt); what no
one may serve without a person stays needs_you; what an attempt learned reaches the next one as
STELLA_FACTS. Real worker processes (the command pipeline), a real ledger and claim store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fleet import RUN, run_of_one_task, write_config

from stellafleet.core.config import load_config
from stellafleet.core.status import FollowUpReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.serve import RequestTaken, Server, TaskFailed
from stellafleet.run.steps import AttemptState, AttemptStep, FollowUp, RunSettings
from stellafleet.run.steps.claims import Claims
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

TASK = PlanTask("t1", "do it", "a task", claims=("x.txt",))


class AskTwice(AttemptStep):
    """Sets a fact on each attempt; asks for one follow-up, then one only a person may serve."""

    def __init__(self, ledger: Ledger, *, last: FollowUp | None) -> None:
        self.ledger, self.last, self.released_count = ledger, last, 0

    def before_start(self, attempt: AttemptState) -> None:
        self.ledger.facts.set(attempt.ctx.attempt_id, f"port-{attempt.ctx.attempt_id}", 8100)

    def released(self, attempt: AttemptState) -> FollowUp | None:
        self.released_count += 1
        if self.released_count == 1:
            return FollowUp(FollowUpReason.CHECK, "the check said: 2 tests failed")
        return self.last if self.released_count == 2 else None


@pytest.fixture
def parts(git_repo: Path, tmp_path: Path) -> Iterator[tuple[Path, Ledger, ClaimStore]]:
    marks = tmp_path / "marks"
    marks.mkdir()
    # each attempt leaves the prompt it was given and the facts it was handed
    write_config(git_repo, run=f'printf %s "$STELLA_PROMPT" > {marks}/prompt-$STELLA_ATTEMPT_ID; '
                 f'printf %s "$STELLA_FACTS" > {marks}/facts-$STELLA_ATTEMPT_ID')  # fmt: skip
    with run_of_one_task(git_repo, TASK) as opened:
        yield opened


def server_for(parts: tuple[Path, Ledger, ClaimStore], *steps: AttemptStep) -> tuple[Server, LocalExecutor]:
    root, ledger, store = parts
    settings = RunSettings(root, RUN, ledger.runs.get(RUN)["base_commit"], default_pipeline="command",
                           config=load_config(root))  # fmt: skip
    executor = LocalExecutor()
    return Server(
        Dispatcher(settings, ledger, executor, lambda event: None, [Claims(store, root), *steps])
    ), executor


def test_a_follow_up_is_a_request_served_once_with_its_context_and_the_tasks_facts(
    parts: tuple[Path, Ledger, ClaimStore], tmp_path: Path
) -> None:
    _, ledger, _ = parts
    server, executor = server_for(parts, AskTwice(ledger, last=None))
    try:
        assert server.execute(TASK) is True
    finally:
        executor.close()
    record = ledger.get_run(RUN)
    first, second = record["attempts"]
    (request,) = record["requests"]
    assert (request["reason"], request["state"], request["asked_by"]) == ("check", "served", "step")
    assert request["from_attempt_id"] == first["id"] and request["attempt_id"] == second["id"]
    assert request["why"] == "its attempt succeeded" and request["taken_at_ms"] is not None
    assert (first["reason"], second["reason"]) == (None, "check")
    marks = tmp_path / "marks"
    assert (marks / f"prompt-{first['id']}").read_text() == "do it"
    assert (marks / f"prompt-{second['id']}").read_text() == "do it\n\n---\nthe check said: 2 tests failed"
    # the first attempt's facts reach the second, beside the one a step set for it before it started
    assert json.loads((marks / f"facts-{first['id']}").read_text()) == {f"port-{first['id']}": 8100}
    assert json.loads((marks / f"facts-{second['id']}").read_text()) == {
        f"port-{first['id']}": 8100,
        f"port-{second['id']}": 8100,
    }
    assert ledger.requests.needing_you(RUN) == [] and record["tasks"][0]["status"] == "succeeded"


def test_a_follow_up_no_one_may_serve_without_a_person_waits_on_one(
    parts: tuple[Path, Ledger, ClaimStore],
) -> None:
    _, ledger, _ = parts
    waits = FollowUp(FollowUpReason.STALE, "its parent moved", needs_you=True)
    server, executor = server_for(parts, AskTwice(ledger, last=waits))
    try:
        assert server.execute(TASK) is True  # the attempts succeeded; what is left waits on a person
    finally:
        executor.close()
    (served, waiting) = ledger.get_run(RUN)["requests"]
    assert served["state"] == "served"
    assert (waiting["reason"], waiting["state"], waiting["context"]) == (
        "stale",
        "needs_you",
        "its parent moved",
    )
    assert waiting["attempt_id"] is None and len(ledger.get_run(RUN)["attempts"]) == 2


def test_a_failed_task_with_nothing_left_to_try_waits_on_a_person_until_it_succeeds(
    parts: tuple[Path, Ledger, ClaimStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, ledger, _ = parts
    write_config(root, run=f'printf %s "$STELLA_FACTS" > {tmp_path}/facts; exit 1')
    monkeypatch.setenv("STELLA_FACTS", '{"from": "the fleet\'s own environment"}')  # a fleet inside a worker
    server, executor = server_for(parts)
    try:
        with pytest.raises(TaskFailed, match="exit status 1"):
            server.execute(TASK)
        (waiting,) = ledger.requests.needing_you(RUN)
        assert (waiting["reason"], waiting["asked_by"]) == ("retry", "fleet")
        assert "exit status 1" in waiting["context"]
        assert waiting["from_attempt_id"] == ledger.get_run(RUN)["attempts"][0]["id"]
        assert (tmp_path / "facts").read_text() == ""  # a task with no facts is handed none
        write_config(root, run="true")
        assert server.execute(TASK) is True
    finally:
        executor.close()
    assert ledger.requests.needing_you(RUN) == []
    assert ledger.requests.get(waiting["id"])["why"] == "it succeeded"


def test_a_request_another_process_took_is_not_served_again(parts: tuple[Path, Ledger, ClaimStore]) -> None:
    _, ledger, _ = parts
    server, executor = server_for(parts)
    try:
        asked = server.ask(TASK.id, FollowUp(FollowUpReason.CI_FIX, "CI failed"), asked_by="watch")
        assert ledger.requests.take(asked)  # another process got there first
        with pytest.raises(RequestTaken, match=f"request {asked} was taken by another process"):
            server.serve(asked, TASK)
        assert server.serve_waiting(asked, TASK) == f"request {asked} was taken by another process"
    finally:
        executor.close()
    assert ledger.get_run(RUN)["attempts"] == []
