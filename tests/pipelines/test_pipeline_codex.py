"""The codex pipeline against a fake `codex exec --json`: pricing, the guard it enforces, every ending.

The real Codex is run in test_real_codex.py. The fake stays for what the real one cannot be made to do on
demand: crash, hang, print garbage, fail a turn, emit error events, or report several turns' running totals.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.agents import (
    FakeAgents,
    RecordingSpend,
    config,
    pid_alive,
    run_pipeline,
)
from helpers.fleet import wait_until

from stellafleet.core.pricing import TokenUsage, price_for
from stellafleet.core.spend import SpendTally
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.codex import CodexFollower, CodexPipeline, WriteSpans
from stellafleet.state.claims import ClaimStore

MODEL = "gpt-5"


def run(
    root: Path, cfg: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[RecordingSpend, PipelineResult]:
    ctx_args.setdefault("model", MODEL)
    return run_pipeline(CodexPipeline(), root, cfg, **ctx_args)


def price(input_tokens: int, cached: int, output: int) -> float:
    pricer = price_for(MODEL, config())
    assert pricer is not None
    return pricer.cost(TokenUsage(input_tokens=input_tokens, output_tokens=output, cache_read_tokens=cached))


def test_success_prices_the_token_usage_and_keeps_the_last_message(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script(
        {
            "edits": [{"path": "notes.txt", "content": "hi\n"}],
            "turns": [{"input_tokens": 24000, "cached_input_tokens": 6000, "output_tokens": 900}],
            "message": "Added notes.txt.",
        }
    )
    spend, result = run(git_repo, guard=1.0)
    assert result.success, result.summary
    assert result.summary == "Added notes.txt."
    expected = price(24000, 6000, 900)
    assert expected > 0
    assert spend.usd == pytest.approx(expected)
    assert result.spend_usd == pytest.approx(expected)
    assert (spend.total("input_tokens"), spend.total("output_tokens")) == (24000, 900)
    assert result.steps == 1 and spend.total("steps") == 1  # the file change
    argv = fakes.argv("codex")
    assert argv[:7] == ["exec", "--json", "--sandbox", "workspace-write", "-C", str(git_repo), "--model"]
    assert argv[7] == MODEL
    assert argv[-1] == "-"  # the prompt comes on stdin: one argument holds at most 128 KiB
    prompt = fakes.prompt("codex")
    assert prompt.startswith("Write notes.txt") and "stella commit -m" in prompt


def test_running_totals_are_priced_by_what_each_adds(git_repo: Path, fakes: FakeAgents) -> None:
    turns = [
        {"input_tokens": 10000, "cached_input_tokens": 0, "output_tokens": 500},
        {"input_tokens": 30000, "cached_input_tokens": 8000, "output_tokens": 1500},
    ]
    fakes.script({"turns": turns})
    spend, result = run(git_repo)
    assert result.success
    assert [call["input_tokens"] for call in spend.calls if call["usd"]] == [10000, 20000]
    assert spend.usd == pytest.approx(price(10000, 0, 500) + price(20000, 8000, 1000))


def test_guard_stops_codex_before_its_later_turns(git_repo: Path, fakes: FakeAgents) -> None:
    turns = [
        {"input_tokens": 100_000, "cached_input_tokens": 0, "output_tokens": 2_000},
        {"input_tokens": 200_000, "cached_input_tokens": 0, "output_tokens": 4_000},
        {"input_tokens": 300_000, "cached_input_tokens": 0, "output_tokens": 6_000},
        {"input_tokens": 400_000, "cached_input_tokens": 0, "output_tokens": 8_000},
    ]
    first, second = price(100_000, 0, 2_000), price(100_000, 0, 2_000)
    guard = first + second / 2  # crossed by the second turn
    fakes.script({"turns": turns, "pause_s": 2.0, "spawn_child": True})
    started = time.monotonic()
    spend, result = run(git_repo, guard=guard)
    elapsed = time.monotonic() - started
    assert not result.success
    assert result.summary.startswith(f"codex was stopped: spend guard of ${guard:.4f}".rstrip("0"))
    assert "priced from its token usage" in result.summary
    emitted = [entry["index"] for entry in fakes.log("turn_completed", "codex")]
    assert emitted == [0, 1]  # signalled during the pause after turn 1, before turns 2 and 3
    assert fakes.log("terminated", "codex")
    assert elapsed < 4 * 2.0 - 1.0  # stopped, not run through every pause (the order above says when)
    assert spend.usd == pytest.approx(first + second)  # the priced usage, nothing more
    assert result.spend_usd == pytest.approx(first + second)
    (spawned,) = fakes.log("spawned", "codex")
    child = spawned["child_pid"]
    wait_until(lambda: not pid_alive(child), "the CLI's child to end after the stop")


def test_config_price_override_is_used(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script(
        {"turns": [{"input_tokens": 1_000_000, "cached_input_tokens": 0, "output_tokens": 1_000_000}]}
    )
    cfg = {"prices": {"local-coder": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}
    spend, result = run(git_repo, cfg, model="local-coder", guard=10.0)
    assert result.success
    assert spend.usd == pytest.approx(3.0)


def test_a_guard_without_a_price_refuses_to_start(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({})
    _spend, result = run(git_repo, model="mystery-model-9", guard=1.0)
    assert not result.success
    assert result.summary.startswith(
        "codex was not started: it has no budget flag of its own and no price known"
    )
    assert '[prices."mystery-model-9"]' in result.summary
    _spend, result = run(git_repo, model=None, guard=1.0)
    assert "set [pipelines.codex] model" in result.summary
    assert not fakes.log("start", "codex")


def test_without_a_guard_an_unpriced_model_still_runs_and_counts_tokens(
    git_repo: Path, fakes: FakeAgents
) -> None:
    fakes.script({})
    spend, result = run(git_repo, model="mystery-model-9")
    assert result.success
    assert spend.usd == 0 and spend.total("input_tokens") == 20000
    assert "(spend not priced: no price known for mystery-model-9)" in result.summary


def test_turn_failed(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "turn_failed", "message": "You exceeded your current quota"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary == "codex turn failed: You exceeded your current quota"


def test_error_event(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "error", "message": "stream disconnected before completion"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary == "codex reported an error: stream disconnected before completion"


def test_malformed_output(git_repo: Path, fakes: FakeAgents, capsys: pytest.CaptureFixture[str]) -> None:
    fakes.script({"mode": "malformed"})
    _spend, result = run(git_repo)
    assert not result.success
    assert (
        result.summary == "could not parse codex output: not a JSON event: 'codex: this is not a JSON event'"
    )
    assert "| codex: this is not a JSON event" in capsys.readouterr().err


def test_crash(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "crash", "exit_code": 2, "stderr": "Error: Not logged in"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary == "codex ended (exit status 2) before reporting a result: Error: Not logged in"


def test_hang_past_the_task_timeout(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "hang"})
    _spend, result = run(git_repo, timeout=3.0)
    assert not result.success
    stopped = "codex did not finish within the task timeout of 3s and was stopped"
    assert result.summary == f"{stopped} ($0.00 spent)"
    assert fakes.log("terminated", "codex")


def wire(event: dict[str, Any]) -> str:
    """An event as Codex prints it (compact JSON, its fields in its order)."""
    return json.dumps(event, separators=(",", ":"))


def item(event: str, item_id: str, kind: str, **fields: Any) -> str:
    return wire({"type": f"item.{event}", "item": {"id": item_id, "type": kind, **fields}})


def command(event: str, item_id: str, cmd: str) -> str:
    done = event == "completed"
    status = {"exit_code": 0, "status": "completed"} if done else {"exit_code": None, "status": "in_progress"}
    return item(
        event, item_id, "command_execution", command=f"/bin/bash -c {cmd}", aggregated_output="", **status
    )


PATCH = [{"path": "/tmp/cx/ws/a.txt", "kind": "update"}, {"path": "/tmp/cx/ws/b.txt", "kind": "add"}]
USAGE = {"input_tokens": 400, "cached_input_tokens": 0, "cache_write_input_tokens": 0, "output_tokens": 40}
# What Codex 0.169 printed (`codex exec --json` against the scripted model server), with the time each line
# was read: a command, a patch (`apply_patch` through exec_command), a message, a slow command, a command
# still running when the turn ended; last, a patch as older Codex reported it (`item_type`, once applied).
CODEX_EVENTS = [
    (100, wire({"type": "thread.started", "thread_id": "01a24f4f-625a-7d22-b574-91b0758f8432"})),
    (200, wire({"type": "turn.started"})),
    (300, command("started", "item_1", "\"printf 'x\\\\n' > c.txt\"")),
    (310, command("completed", "item_1", "\"printf 'x\\\\n' > c.txt\"")),
    (400, item("started", "item_2", "file_change", changes=PATCH, status="in_progress")),
    (480, item("completed", "item_2", "file_change", changes=PATCH, status="completed")),
    (500, item("completed", "item_3", "agent_message", text="now a slow one")),
    (600, command("started", "item_4", "'sleep 0.3; printf y > d.txt; sleep 0.3'")),
    (900, command("completed", "item_4", "'sleep 0.3; printf y > d.txt; sleep 0.3'")),
    (1000, command("started", "item_5", "'sleep 1.5; printf w > f.txt'")),
    (1100, item("completed", "item_6", "agent_message", text="done")),
    (
        1200,
        wire({"type": "item.completed", "item": {"id": "itm_7", "item_type": "file_change", "changes": []}}),
    ),
    (1300, wire({"type": "turn.completed", "usage": {**USAGE, "reasoning_output_tokens": 0}})),
]


def test_a_shared_codex_workers_write_spans_run_from_the_line_before_its_calls_to_their_end(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    times = iter([50] + [at for at, _ in CODEX_EVENTS])
    follower = CodexFollower(
        None, SpendTally(), None, tmp_path, WriteSpans(db, "r-1", 7, lambda: next(times))
    )
    for _, line in CODEX_EVENTS:
        assert follower(line) is None
    with ClaimStore.open(db) as store:
        spans = sorted(store.write_spans("r-1", 7) or [], key=str)
        assert store.write_spans("r-1", 8) is None  # another attempt reported nothing
    assert spans == sorted(
        [
            (200, 310),  # the command: from turn.started, as Codex printed item.started after it wrote
            (200, 480),  # the patch, right after it, with no other line between: from the same line
            (500, 900),  # after the message, a new answer's command: from the message
            (500, None),  # a command still running at the end: open, to the attempt's end
            (1100, 1200),  # a patch reported only once applied: from the line before
        ],
        key=str,
    )
    assert follower.bad_line is None and follower.steps == 4  # the completed commands and patches
    assert follower.last_message == "done" and follower.turns_completed == 1
