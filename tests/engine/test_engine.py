"""The engine end to end through the scripted model server, in both wire formats, on real repositories."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.engine import (
    engine_config,
    make_context,
    make_repo,
    run_engine,
    tool_messages,
    transcript_records,
)

from stellafleet.git import gitops, worktrees
from stellafleet.state.ledger import Ledger
from stellafleet.testing.model_server import ScriptedModelServer

WIRES = ["openai", "anthropic"]


def call(name: str, **arguments: object) -> dict[str, object]:
    return {"name": name, "arguments": arguments}


def session_script() -> list[dict[str, object]]:
    return [
        {"text": "Looking first.", "tool_calls": [call("list_dir"), call("read_file", path="src/app.py")]},
        {"tool_calls": [call("grep", pattern="return 4[0-9]")]},
        {
            "tool_calls": [
                call("edit_file", path="src/app.py", old_text="return 41", new_text="return 42"),
                call("write_file", path="docs/answer.md", content="The answer is 42.\n"),
            ]
        },
        {"tool_calls": [call("git_status"), call("git_diff", path="src/app.py")]},
        {"tool_calls": [call("commit", message="Fix the answer and document it")]},
        {"tool_calls": [call("finish", summary="Fixed answer() to return 42 and documented it.")]},
    ]


@pytest.mark.parametrize("wire", WIRES)
def test_session_reads_edits_commits_and_finishes(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    (root / "notes.txt").write_text("the user's own unstaged work\n")
    ctx = make_context(root)
    before = gitops.head_commit(root)
    with ScriptedModelServer(session_script()) as server:
        run = run_engine(ctx, engine_config(server, wire))
    assert run.result.success, run.result
    assert run.result.summary == "Fixed answer() to return 42 and documented it."
    assert run.result.steps == 6 and len(server.requests) == 6
    assert all(r.wire == wire for r in server.requests)
    # The commit landed on HEAD with exactly the written paths, nothing else swept in.
    head = gitops.head_commit(root)
    assert gitops.git("rev-parse", "HEAD^", cwd=root).strip() == before
    changed = gitops.git("diff-tree", "--no-commit-id", "--name-only", "-r", head, cwd=root).split()
    assert sorted(changed) == ["docs/answer.md", "src/app.py"]
    assert gitops.git("show", "HEAD:src/app.py", cwd=root) == "def answer():\n    return 42\n"
    assert gitops.status_porcelain(root) == ["?? notes.txt"]
    with Ledger.open(root / ".stella/private/fleet.db", readonly=True) as ledger:
        commits = ledger.get_run(ctx.run_id)["commits"]
    assert [c["sha"] for c in commits] == [head]
    # The model saw real tool output: the file with line numbers, the grep hit, the diff.
    results = tool_messages(server.requests[-1].body)
    assert "     2\t    return 41" in results[1]
    assert "src/app.py:2:    return 41" in results[2]
    assert any("+    return 42" in r for r in results)
    assert any(r.startswith("committed ") for r in results)
    kinds = [r["type"] for r in transcript_records(ctx)]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("model") == 6


@pytest.mark.parametrize("wire", WIRES)
def test_bad_tool_arguments_go_back_to_the_model_which_corrects_them(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [
        {"tool_calls": [{"name": "write_file", "arguments": '{"path": "out.txt", "content": "hi'}]},
        {"tool_calls": [call("write_file", path="out.txt", content={"text": "hi"})]},
        {"tool_calls": [call("write_file", content="hi")]},
        {"tool_calls": [call("no_such_tool", x=1), call("read_file", path="out.txt", start_line="one")]},
        {"text": "No tool this time."},
        {"tool_calls": [call("write_file", path="out.txt", content="hi\n")]},
        {"tool_calls": [call("commit", message="Add out.txt", paths=["out.txt"])]},
        {"tool_calls": [call("finish", summary="wrote out.txt")]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, wire))
    assert run.result.success and run.result.steps == 8, run.result
    errors = [t["result"] for t in run.tool_results() if t["is_error"]]
    assert "not valid JSON" in errors[0]
    assert "argument 'content' must be a string, got an object" in errors[1]
    assert "missing required argument 'path'" in errors[2]
    assert "unknown tool 'no_such_tool'" in errors[3]
    assert "argument 'start_line' must be an integer, got a string" in errors[4]
    # Each error reached the model as the result of its call, and the nudge followed the text-only reply.
    assert "not valid JSON" in tool_messages(server.requests[1].body)[0]
    assert json.dumps(server.requests[5].body).count("Reply with tool calls only") == 1
    assert (root / "out.txt").read_text() == "hi\n"
    assert gitops.git("show", "--name-only", "--format=", "HEAD", cwd=root).split() == ["out.txt"]


@pytest.mark.parametrize("wire", WIRES)
def test_429_is_retried_after_the_retry_after_delay(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [
        {"error": {"status": 429, "retry_after": "7", "body": "slow down"}},
        {"tool_calls": [call("finish", summary="done after a rate limit")]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, wire))
    assert run.result.success and run.result.summary == "done after a rate limit"
    assert run.clock.sleeps == [7.0]
    assert len(server.requests) == 2


@pytest.mark.parametrize("wire", WIRES)
def test_5xx_past_the_retry_limit_ends_in_a_clean_failure(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [{"repeat": 3, "error": {"status": 503, "body": "upstream overloaded"}}]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, wire, max_retries=2))
    assert not run.result.success
    assert len(server.requests) == 3
    assert run.clock.sleeps == [1.0, 2.0]  # exponential backoff without Retry-After
    assert "HTTP 503" in run.result.summary and "upstream overloaded" in run.result.summary
    assert "after 3 attempts" in (run.result.error or "")
    assert "Traceback" not in run.result.summary
    assert transcript_records(ctx)[-1]["stop"] == "model_error"


def test_connection_errors_are_retried(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [{"disconnect": True}, {"tool_calls": [call("finish", summary="ok")]}]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, "openai"))
    assert run.result.success and len(server.requests) == 2 and run.clock.sleeps == [1.0]


def test_step_limit_ends_the_attempt_failed(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [{"repeat": 5, "tool_calls": [call("git_status")]}]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, "openai", max_steps=3))
    assert not run.result.success and run.result.steps == 3 and len(server.requests) == 3
    assert "step limit" in run.result.summary


def test_finish_with_uncommitted_work_says_so(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [
        {"tool_calls": [call("write_file", path="a.txt", content="a\n")]},
        {"tool_calls": [call("finish", summary="could not finish", success=False)]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, "anthropic"))
    assert not run.result.success
    assert run.result.summary == "could not finish\n(left uncommitted: a.txt)"


@pytest.mark.parametrize("wire", WIRES)
def test_escapes_through_the_model_are_refused_and_nothing_outside_changes(tmp_path: Path, wire: str) -> None:
    root = make_repo(tmp_path / "repo")
    (root / "etc-link").symlink_to("/etc")
    ctx = make_context(root)
    script = [
        {
            "tool_calls": [
                call("write_file", path="../escape.txt", content="x"),
                call("read_file", path="/etc/passwd"),
                call("edit_file", path="etc-link/hostname", old_text="a", new_text="b"),
                call("list_dir", path="etc-link"),
            ]
        },
        {"tool_calls": [call("finish", summary="refused", success=False)]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, wire))
    results = tool_messages(server.requests[1].body)
    assert len(results) == 4 and all(r.startswith("error: ") for r in results)
    assert "climbs out" in results[0] and "absolute" in results[1]
    assert "symlink" in results[2] and "symlink" in results[3]
    assert not (tmp_path / "escape.txt").exists() and "root:" not in json.dumps(server.requests[1].body)
    assert not run.result.success


def test_wall_time_limit_stops_before_the_next_call(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    ctx = make_context(root)
    script = [
        {"error": {"status": 429, "retry_after": "100"}},
        {"tool_calls": [call("git_status")]},
        {"tool_calls": [call("finish", summary="never reached")]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, "openai", max_wall_seconds=50))
    assert len(server.requests) == 2 and not run.result.success
    assert "wall-time limit of 50 s" in run.result.summary


def test_isolated_worktree_commits_land_on_its_own_branch(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    base = gitops.head_commit(root)
    tree = root / ".stella/worktrees/iso-0123456789abcdef"
    worktrees.worktree_add(root, tree, "fleet/iso-0123456789abcdef", base)
    ctx = replace(
        make_context(root), workspace=tree, isolation="isolated", branch="fleet/iso-0123456789abcdef"
    )
    script = [
        {"tool_calls": [call("write_file", path="iso.txt", content="isolated\n")]},
        {"tool_calls": [call("commit", message="Add iso.txt")]},
        {"tool_calls": [call("finish", summary="done in isolation")]},
    ]
    with ScriptedModelServer(script) as server:
        run = run_engine(ctx, engine_config(server, "anthropic"))
    assert run.result.success
    assert gitops.head_commit(root) == base  # the user's checkout did not move
    tip = gitops.resolve_commit(root, "fleet/iso-0123456789abcdef")
    assert [c.message for c in gitops.commits_between(root, base, tip)] == ["Add iso.txt"]
    assert not (root / "iso.txt").exists()
