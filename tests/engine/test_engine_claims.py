"""Two engines in one shared tree: the first write claims a file; the second worker is told who holds it."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.engine import engine_config, make_context, make_repo, run_engine, tool_messages

from stellafleet.git import gitops
from stellafleet.state.claims import ClaimStore
from stellafleet.testing.model_server import ScriptedModelServer


def test_second_engine_gets_the_holders_name_and_the_file_keeps_the_first_content(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    first = make_context(root, task_id="schema", title="Add the migration")
    second = make_context(root, task_id="reader", title="Read path")
    first_script = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "shared.txt", "content": "first\n"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "wrote shared.txt"}}]},
    ]
    second_script = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "./shared.txt", "content": "second\n"}}
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "edit_file",
                    "arguments": {"path": "shared.txt", "old_text": "first", "new_text": "x"},
                }
            ]
        },
        {
            "tool_calls": [
                {"name": "finish", "arguments": {"summary": "shared.txt is held", "success": False}}
            ]
        },
    ]
    with ScriptedModelServer(first_script) as server_a, ScriptedModelServer(second_script) as server_b:
        run_a = run_engine(first, engine_config(server_a, "openai"))
        run_b = run_engine(second, engine_config(server_b, "anthropic"))
    assert run_a.result.success and not run_b.result.success
    expected = (
        f'claim conflict: shared.txt is held by task "schema" (Add the migration) '
        f"(run {first.run_id}, pid {os.getpid()})"
    )
    results = tool_messages(server_b.requests[2].body)
    assert results == [f"error: {expected}", f"error: {expected}"]
    assert (root / "shared.txt").read_text() == "first\n"
    with ClaimStore.open(root / ".stella/private/store.db") as store:
        holder = dict(store.claims()).get("shared.txt")
    assert holder is not None and holder.task_id == "schema"
    assert gitops.status_porcelain(root) == ["?? shared.txt"]


def test_a_released_claim_lets_the_next_worker_write(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    first = make_context(root, task_id="a")
    second = make_context(root, task_id="b")
    write = {"tool_calls": [{"name": "write_file", "arguments": {"path": "f.txt", "content": "b\n"}}]}
    done = {"tool_calls": [{"name": "finish", "arguments": {"summary": "ok"}}]}
    with ScriptedModelServer([{**write}, done]) as server_a:
        run_engine(first, engine_config(server_a))
    with ClaimStore.open(root / ".stella/private/store.db") as store:
        assert store.release_attempt(first.run_id, first.attempt_id) == 1
    with ScriptedModelServer([write, done]) as server_b:
        run_b = run_engine(second, engine_config(server_b))
    assert run_b.result.success and not any(t["is_error"] for t in run_b.tool_results())
