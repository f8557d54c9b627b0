"""Every follow-up continues the task's agent session: the engine (real worker processes against the
scripted model server) reloads its conversation from its transcript and is sent only what is new; past
`[fleet] resume_max_tokens` it starts afresh and says why; under `[fleet] park_wait` a parked task's answer
resumes it while its run goes on. The choice itself, in process."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.enginefleet import configure
from helpers.fleet import RUN, run_of_one_task

from stellafleet.core.config import load_config
from stellafleet.core.status import FollowUpReason
from stellafleet.engine.loop import NUDGE
from stellafleet.engine.messages import AssistantTurn, ToolResults, UserText
from stellafleet.engine.replay import conversation
from stellafleet.pipelines.sessions import Resume
from stellafleet.plan.model import PlanTask
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.serve import Server
from stellafleet.run.steps import AttemptState, AttemptStep, FollowUp, RunSettings
from stellafleet.run.steps.park import Park
from stellafleet.run.steps.sessions import Sessions, choose
from stellafleet.state.ledger import Ledger
from stellafleet.testing.model_server import ScriptedModelServer

TASK = PlanTask("t1", "marker-t1: read the README and say what it is", "a task")
RED = "the check said: 2 tests failed"


class OneRound(AttemptStep):
    """Asks for one check round, as a red check does."""

    def __init__(self) -> None:
        self.released_count = 0

    def released(self, attempt: AttemptState) -> FollowUp | None:
        self.released_count += 1
        return FollowUp(FollowUpReason.CHECK, RED) if self.released_count == 1 else None


def engine_steps(tokens: int) -> list[dict[str, Any]]:
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]}
    finish = {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]}
    usage = {"input_tokens": tokens, "output_tokens": 20}
    return [{**read, "usage": usage}, {**finish, "usage": usage}] * 2


@pytest.fixture
def opened(git_repo: Path) -> Iterator[tuple[Path, Ledger]]:
    with run_of_one_task(git_repo, TASK) as (root, ledger, _store):
        yield root, ledger


def serve_two_attempts(root: Path, ledger: Ledger, server: ScriptedModelServer, fleet: str = "") -> None:
    configure(root, server, fleet=fleet)
    settings = RunSettings(root, RUN, ledger.runs.get(RUN)["base_commit"], default_pipeline="plain",
                           config=load_config(root))  # fmt: skip
    steps = [Sessions(settings, ledger), OneRound()]
    assert Server(Dispatcher(settings, ledger, LocalExecutor(), lambda event: None, steps)).execute(TASK)


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]


def test_an_engine_check_round_goes_on_in_its_session_with_only_the_red_check(
    opened: tuple[Path, Ledger],
) -> None:
    root, ledger = opened
    with ScriptedModelServer(engine_steps(1200)) as server:
        serve_two_attempts(root, ledger, server)
        bodies = [r.body for r in server.requests]
    first, second = (a["id"] for a in ledger.attempts.of_run(RUN))
    # the round's first request carries the whole first session, then only the red check
    round_start = bodies[2]
    assert len(round_start["messages"]) > len(bodies[1]["messages"])
    assert user_texts(round_start)[-1] == RED
    assert sum(TASK.prompt in text for text in user_texts(round_start)) == 1  # the task, once, as it was
    facts = ledger.facts.of_attempt(second)
    transcript = ledger.facts.of_attempt(first)["session"]["id"]
    assert facts["resume"]["id"] == transcript and facts["resume"]["tail"] == len(RED)
    assert facts["session_start"].startswith("resumed session t1.jsonl (")
    assert facts["session"]["id"] == transcript  # the same session goes on


def test_a_session_over_resume_max_tokens_starts_afresh_and_says_so(opened: tuple[Path, Ledger]) -> None:
    root, ledger = opened
    with ScriptedModelServer(engine_steps(1200)) as server:
        serve_two_attempts(root, ledger, server, fleet="resume_max_tokens = 1000")
        round_start = server.requests[2].body
    second = ledger.attempts.of_run(RUN)[-1]["id"]
    facts = ledger.facts.of_attempt(second)
    assert facts["resume"] is None
    assert facts["session_start"].startswith("new session: the last one is over resume_max_tokens (1,2")
    (task_text,) = user_texts(round_start)  # a new conversation: the whole task and the red check
    assert TASK.prompt in task_text and RED in task_text


def test_the_choice_names_why_a_session_is_not_continued() -> None:
    session = {"id": "3f2a9c01-aaaa", "cwd": "/w", "tokens": 41_200}
    new = {"tail": 120}
    resumed = choose(("claude-code", session), "claude-code", max_tokens=150_000, new=new)
    assert resumed.said == "resumed session 3f2a9c01... (41,200 tokens)"
    assert resumed.resume == {"id": "3f2a9c01-aaaa", "cwd": "/w", "tokens": 41_200, "tail": 120}
    big = {**session, "tokens": 162_000}
    over = choose(("claude-code", big), "claude-code", max_tokens=150_000, new=new)
    assert (over.resume, over.said) == (None, "new session: the last one is over resume_max_tokens (162,000)")
    other = choose(("codex", session), "claude-code", max_tokens=150_000, new=new)
    assert other.resume is None and "codex's" in other.said
    assert choose(None, "plain", max_tokens=1, new=new).said == "new session: the task has no earlier session"


def test_a_follow_ups_new_words_are_the_end_of_its_prompt_however_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = "x" * 300_000  # far past what one environment variable may hold
    monkeypatch.setenv(
        "STELLA_FACTS", json.dumps({"resume": {"id": "s1", "cwd": "/w", "tokens": 5, "tail": len(log)}})
    )
    resume = Resume.of(f"the task\n\n---\n{log}")
    assert resume is not None and resume.prompt == log and len(os.environ["STELLA_FACTS"]) < 200


def test_the_engine_conversation_comes_back_from_its_transcript(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    call = {"id": "c1", "name": "read_file", "arguments": '{"path": "a"}'}
    finish = {"id": "c2", "name": "finish", "arguments": "{}"}
    records = [
        {"type": "start"},
        {"type": "task", "task": "old task"},  # an earlier session: forgotten at the next `task`
        {"type": "task", "task": "do it"},
        {"type": "model", "text": "", "tool_calls": [call]},
        {"type": "tool", "name": "read_file", "result": "A"},
        {"type": "model", "text": "hm", "tool_calls": []},
        {"type": "model", "text": "", "tool_calls": [finish]},
        {"type": "tool", "name": "finish", "result": "finished"},
        {"type": "end"},
        {"type": "resume", "prompt": "now fix the check", "from": str(path)},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    messages = conversation(path, NUDGE)
    assert messages[0] == UserText("Task:\ndo it")
    assert isinstance(messages[1], AssistantTurn) and isinstance(messages[2], ToolResults)
    assert messages[4] == UserText(NUDGE)  # what the loop said after a turn without tool calls
    assert isinstance(messages[6], ToolResults) and messages[6].results[0].content == "finished"
    assert messages[-1] == UserText("now fix the check")


def test_under_park_wait_an_answer_resumes_the_parked_task_while_its_run_goes_on(
    opened: tuple[Path, Ledger],
) -> None:
    root, ledger = opened
    ask = {"tool_calls": [{"name": "ask", "arguments": {"question": "red or blue?"}}]}
    finish = {"tool_calls": [{"name": "finish", "arguments": {"summary": "painted"}}]}
    with ScriptedModelServer([ask, finish]) as server:
        configure(root, server, fleet="park_wait = 60")
        settings = RunSettings(root, RUN, ledger.runs.get(RUN)["base_commit"], default_pipeline="plain",
                               config=load_config(root))  # fmt: skip
        steps = [Sessions(settings, ledger), Park(settings, ledger)]
        server_ = Server(Dispatcher(settings, ledger, LocalExecutor(), lambda event: None, steps))
        answered: list[bool] = []

        def answer_when_asked() -> None:
            while not (waiting := ledger.requests.waiting()):
                time.sleep(0.05)
            answered.append(ledger.requests.answer(waiting[0]["id"], "text", "blue", by="test"))

        person = threading.Thread(target=answer_when_asked)
        person.start()
        assert server_.execute(TASK)  # parked, answered, resumed: in the one call
        person.join()
        last = server.requests[-1].body
    assert answered == [True]
    parked, resumed = ledger.attempts.of_run(RUN)
    assert (parked["outcome"], resumed["outcome"], resumed["reason"]) == ("parked", "succeeded", "answer")
    assert "blue" in json.dumps(last["messages"][-1]) and "red or blue?" in json.dumps(last)
    (request,) = ledger.requests.of_run(RUN)
    assert (request["state"], request["attempt_id"], request["answered_by"]) == (
        "served",
        resumed["id"],
        "test",
    )
