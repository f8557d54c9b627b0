"""The claude-code pipeline against a fake `claude` that speaks Claude Code's headless formats.

The real Claude Code is run in test_real_claude_code.py. The fake stays for what the real one cannot be made
to do on demand: crash, hang, print garbage, end with an API error or at its turn limit, and the hook's
fail-closed cases.
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
    make_context,
    pid_alive,
    prepare,
    run_pipeline,
)
from helpers.fleet import wait_until

from stellafleet.core.spend import SpendTally
from stellafleet.pipelines import permit
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.claude_code import ClaudeCodePipeline
from stellafleet.pipelines.claude_hook import HookContext
from stellafleet.pipelines.claude_hook import main as hook_main
from stellafleet.run.steps.unclaimed import EDGE_NS
from stellafleet.state.claims import ClaimStore


def run(root: Path, **ctx_args: Any) -> tuple[RecordingSpend, PipelineResult]:
    return run_pipeline(ClaudeCodePipeline(), root, **ctx_args)


def test_success_reports_cost_turns_and_the_agents_summary(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script(
        {
            "edits": [{"path": "notes.txt", "content": "hi\n"}],
            "cost": 0.0312,
            "num_turns": 4,
            "result": "Wrote notes.txt with the notes.",
        }
    )
    spend, result = run(git_repo, guard=0.5)
    assert result.success, result.summary
    assert result.summary == "Wrote notes.txt with the notes."
    assert spend.calls == [
        {"usd": 0.0312, "input_tokens": 120 + 2000 + 8000, "output_tokens": 450, "steps": 4}
    ]
    assert (result.spend_usd, result.steps) == (0.0312, 4)
    assert (git_repo / "notes.txt").read_text() == "hi\n"
    argv = fakes.argv("claude")
    # the prompt comes on stdin (one argument holds at most 128 KiB): -p is followed by an option
    assert argv[0] == "-p" and argv[1] == "--output-format"
    prompt = fakes.prompt("claude")
    assert prompt.startswith("Write notes.txt")
    assert "stella commit -m" in prompt  # the shared tree's commit rule is part of the prompt
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv
    assert argv[argv.index("--permission-mode") + 1] == "acceptEdits"
    assert "--strict-mcp-config" in argv
    (server,) = json.loads(argv[argv.index("--mcp-config") + 1])["mcpServers"].values()  # stella's only
    assert server["args"][:2] == ["-m", "stellafleet.pipelines.permit"]
    assert argv[argv.index("--permission-prompt-tool") + 1] == "mcp__stella__permit"
    assert argv[argv.index("--max-budget-usd") + 1] == "0.5000"
    settings = json.loads(Path(argv[argv.index("--settings") + 1]).read_text())
    # one hook before and after every tool that can write the tree: its claims and its write spans
    assert list(settings["hooks"]) == ["PreToolUse", "PostToolUse", "PostToolUseFailure"]
    for (group,) in settings["hooks"].values():
        assert group["matcher"] == "Edit|Write|MultiEdit|NotebookEdit|Bash"
        assert "stellafleet.pipelines.claude_hook" in group["hooks"][0]["command"]
    ctx = make_context(git_repo, pipeline="claude-code")
    with ClaimStore.open(ctx.paths.store_db) as store:
        (span,) = store.write_spans(ctx.run_id, ctx.attempt_id) or []  # the Write's, closed after it
    written = (git_repo / "notes.txt").stat().st_mtime_ns  # the file system's clock is coarse: EDGE_NS
    assert span[1] is not None and span[0] - EDGE_NS <= written <= span[1]
    # the stream went to the transcript, one JSON message per line, the result last
    transcript = make_context(git_repo, pipeline="claude-code").transcript_path.read_text().splitlines()
    assert json.loads(transcript[0])["subtype"] == "init"
    assert json.loads(transcript[-1])["type"] == "result"


def test_configured_model_turns_and_extra_args_reach_the_cli(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({})
    ctx = make_context(git_repo, pipeline="claude-code", guard=None)
    prepare(ctx)
    cfg = config(
        {
            "pipelines": {
                "claude-code": {"model": "claude-sonnet-4-5", "max_turns": 12, "extra_args": "--add-dir /x"}
            }
        }
    )
    result = ClaudeCodePipeline().run(ctx, cfg, RecordingSpend())
    assert result.success
    argv = fakes.argv("claude")
    assert argv[argv.index("--model") + 1] == "claude-sonnet-4-5"
    assert argv[argv.index("--max-turns") + 1] == "12"
    assert argv[-2:] == ["--add-dir", "/x"]
    assert "--max-budget-usd" not in argv  # no guard, no budget


def test_isolated_worktree_gets_no_claim_hook_and_git_commit_instructions(
    git_repo: Path, fakes: FakeAgents
) -> None:
    fakes.script({})
    _spend, result = run(git_repo, isolation="isolated", branch="fleet/t1-0123456789abcdef")
    assert result.success
    argv = fakes.argv("claude")
    assert "--settings" not in argv
    assert "own git worktree on branch fleet/t1-0123456789abcdef" in fakes.prompt("claude")


def test_api_error_result_fails_with_the_agents_words(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "api_error", "result": "API Error: 401 invalid x-api-key", "cost": 0.0})
    spend, result = run(git_repo)
    assert not result.success
    assert "Claude Code reported an error: API Error: 401 invalid x-api-key" in result.summary
    assert spend.calls and spend.usd == 0.0


def test_error_during_execution(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "error", "errors": ["tool loop exploded"], "cost": 0.02, "num_turns": 2})
    spend, result = run(git_repo)
    assert not result.success
    assert result.summary.startswith("Claude Code failed during execution: tool loop exploded")
    assert spend.usd == pytest.approx(0.02)


def test_max_budget_ending_is_a_failure_at_the_guard(git_repo: Path, fakes: FakeAgents) -> None:
    # The fake ends with error_max_budget_usd because its cost passes the --max-budget-usd it was given.
    fakes.script({"cost": 0.2611, "num_turns": 7})
    spend, result = run(git_repo, guard=0.25)
    assert not result.success
    assert result.summary == "Claude Code stopped at its spend guard of $0.25: $0.2611 spent in 7 turn(s)"
    assert spend.usd == pytest.approx(0.2611)  # the agent's own report is what is recorded
    assert fakes.argv("claude")[fakes.argv("claude").index("--max-budget-usd") + 1] == "0.2500"


def test_max_turns_ending(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "max_turns", "cost": 0.05})
    ctx = make_context(git_repo, pipeline="claude-code")
    prepare(ctx)
    cfg = config({"pipelines": {"claude-code": {"max_turns": 5}}})
    result = ClaudeCodePipeline().run(ctx, cfg, RecordingSpend())
    assert not result.success
    assert (
        result.summary
        == "Claude Code stopped at its turn limit (5) before finishing: $0.05 spent in 5 turn(s)"
    )


def test_malformed_output(git_repo: Path, fakes: FakeAgents, capsys: pytest.CaptureFixture[str]) -> None:
    fakes.script({"mode": "malformed"})
    spend, result = run(git_repo)
    assert not result.success
    assert result.summary.startswith("could not parse claude output: not a JSON line: 'Claude says hello")
    assert "| Claude says hello, but this is not JSON {" in capsys.readouterr().err  # raw tail in the log
    assert spend.calls == []


def test_crash_reports_exit_code_and_stderr(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "crash", "exit_code": 3, "stderr": "Error: Invalid API key. Please run /login"})
    _spend, result = run(git_repo)
    assert not result.success
    assert result.summary == (
        "claude ended (exit status 3) before reporting a result: Error: Invalid API key. Please run /login"
    )


def test_hang_past_the_task_timeout_stops_the_whole_process_group(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"mode": "hang", "spawn_child": True})
    started = time.monotonic()
    _spend, result = run(git_repo, timeout=3.0)
    assert time.monotonic() - started < 10
    assert not result.success
    assert result.summary == (
        "claude did not finish within the task timeout of 3s and was stopped; "
        "no result was reported, so its spend is unknown"
    )
    assert fakes.log("terminated", "claude")  # SIGTERM first
    (spawned,) = fakes.log("spawned", "claude")
    child = spawned["child_pid"]
    wait_until(lambda: not pid_alive(child), "the CLI's child to end after the stop")


def test_budget_is_rounded_down() -> None:
    assert SpendTally(guard_usd=6 / 7).cli_budget() == "0.8571"
    assert SpendTally(guard_usd=2.0).cli_budget() == "2.0000"
    assert SpendTally().cli_budget() is None


# --- live claims in the shared tree ---


def test_second_worker_editing_a_held_file_is_refused_naming_the_holder(
    git_repo: Path, fakes: FakeAgents
) -> None:
    fakes.script(
        {
            "tasks": {
                "reader": {"edits": [{"path": "src/store.rs", "content": "reader's version\n"}]},
                "writer": {
                    "edits": [
                        {"path": "src/store.rs", "content": "writer's version\n"},
                        {"path": "src/write.rs", "content": "fine\n"},
                    ]
                },
            }
        }
    )
    _spend_a, first = run(git_repo, task_id="reader", title="Read path", attempt_id=1)
    assert first.success, first.summary
    _spend_b, second = run(git_repo, task_id="writer", title="Write path", attempt_id=2)
    (denied,) = fakes.log("denied", "claude")
    assert denied["task"] == "writer" and denied["path"] == "src/store.rs"
    assert denied["reason"].startswith(
        'claim conflict: src/store.rs is held by task "reader" (Read path) (run r-20261130-120000-abcd, pid '
    )
    assert (git_repo / "src/store.rs").read_text() == "reader's version\n"
    assert (git_repo / "src/write.rs").read_text() == "fine\n"
    assert second.success  # the agent adapted; the refusal is in its summary
    assert "1 tool call(s) refused: Write " in second.summary and "src/store.rs" in second.summary
    with ClaimStore.open(git_repo / ".stella/private/store.db") as store:
        holders = {path: holder.task_id for path, holder in store.claims()}
    assert holders == {"src/store.rs": "reader", "src/write.rs": "writer"}


def test_same_attempt_edits_its_own_claimed_file(git_repo: Path, fakes: FakeAgents) -> None:
    fakes.script({"edits": [{"path": "a.txt", "content": "1"}, {"path": "a.txt", "content": "2"}]})
    _spend, result = run(git_repo)
    assert result.success
    assert not fakes.log("denied")
    assert (git_repo / "a.txt").read_text() == "2"


def hook_context(root: Path, tmp_path: Path) -> Path:
    from stellafleet.state.claims import Holder

    holder = Holder.current("r-1", "t1", "title", 1)
    path = tmp_path / "hook.json"
    HookContext(str(root), str(root / ".stella/private/store.db"), holder).write(path)
    return path


def call_hook(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], event: object
) -> dict[str, object] | None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(event)))
    assert hook_main(args) == 0
    out = capsys.readouterr().out
    return json.loads(out) if out.strip() else None


def test_hook_denies_paths_outside_the_workspace_and_fails_closed(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context = str(hook_context(git_repo, tmp_path))
    event = {"hook_event_name": "PreToolUse", "tool_name": "Edit", "tool_input": {"file_path": "/etc/passwd"}}
    out = call_hook(monkeypatch, capsys, [context], event)
    assert out is not None
    decision = out["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny"  # type: ignore[index]
    assert "outside this task's workspace" in decision["permissionDecisionReason"]  # type: ignore[index]
    escape = {"tool_name": "Write", "tool_input": {"file_path": str(git_repo / "../elsewhere.txt")}}
    assert call_hook(monkeypatch, capsys, [context], escape) is not None
    inside = {"tool_name": "NotebookEdit", "tool_input": {"notebook_path": str(git_repo / "nb.ipynb")}}
    assert call_hook(monkeypatch, capsys, [context], inside) is None  # allowed: no output
    broken = call_hook(monkeypatch, capsys, [str(tmp_path / "missing.json")], inside)
    assert broken is not None
    assert "stella could not check the file claim" in broken["hookSpecificOutput"]["permissionDecisionReason"]  # type: ignore[index]
    bash = {"tool_name": "Bash", "tool_input": {"command": "make"}}  # no file: its write span is what failed
    broken = call_hook(monkeypatch, capsys, [str(tmp_path / "missing.json")], bash)
    assert broken is not None
    reason = broken["hookSpecificOutput"]["permissionDecisionReason"]  # type: ignore[index]
    assert reason.startswith("stella could not check when this command may write (FileNotFoundError: ")


def test_the_hooks_open_a_write_span_before_each_writing_tool_and_close_it_after(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context = str(hook_context(git_repo, tmp_path))
    store_db = git_repo / ".stella/private/store.db"
    with ClaimStore.open(store_db) as store:
        store.report_spans("r-1", 1)  # as write_hook_settings does

    def hook(event: str, tool_use_id: str, tool: str = "Bash", **tool_input: object) -> None:
        whole = {"hook_event_name": event, "tool_name": tool, "tool_use_id": tool_use_id}
        assert call_hook(monkeypatch, capsys, [context], {**whole, "tool_input": tool_input}) is None

    hook("PreToolUse", "toolu_1", command="sed -i s/a/b/ x.txt")
    hook("PostToolUse", "toolu_1", command="sed -i s/a/b/ x.txt")
    hook("PreToolUse", "toolu_2", command="false")
    hook("PostToolUseFailure", "toolu_2", command="false")
    hook("PreToolUse", "toolu_3", command="make watch", run_in_background=True)
    hook("PostToolUse", "toolu_3", command="make watch", run_in_background=True)  # it may still write
    denied = {"hook_event_name": "PreToolUse", "tool_name": "Write", "tool_use_id": "toolu_4"}
    assert call_hook(monkeypatch, capsys, [context], {**denied, "tool_input": {"file_path": "/etc/x"}})
    with ClaimStore.open(store_db) as store:
        spans = store.write_spans("r-1", 1) or []
    assert [end is None for _, end in spans] == [False, False, True]  # the denied call never ran
    assert all(end is None or start <= end for start, end in spans)
    # after the call a broken context denies nothing (the span stays open: covered to the attempt's end)
    assert (
        call_hook(monkeypatch, capsys, [str(tmp_path / "gone.json")], {"hook_event_name": "PostToolUse"})
        is None
    )


def test_the_permission_server_allows_what_a_person_allowed_and_parks_the_rest(tmp_path: Path) -> None:
    allowed = [{"tool": "Bash", "input": {"command": "make"}}, {"tool": "WebFetch", "input": {"url": "a"}}]
    (tmp_path / permit.ALLOWED_FILE).write_text(json.dumps(allowed))
    assert json.loads(permit.decide(tmp_path, "Bash", {"command": "make"}))["behavior"] == "allow"
    assert json.loads(permit.decide(tmp_path, "WebFetch", {"url": "b"}))["behavior"] == "allow"  # the tool
    refused = json.loads(permit.decide(tmp_path, "Bash", {"command": "make clean"}))  # only that command
    assert refused["behavior"] == "deny" and refused["interrupt"] is True
    permit.decide(tmp_path, "Bash", {"command": "rm -rf build"})  # the first request parked it
    parked = json.loads((tmp_path / permit.PARK_FILE).read_text())
    assert parked == {"tool": "Bash", "input": {"command": "make clean"}}
