"""The codex pipeline against the real Codex CLI, through a real `stella fleet`.

Codex streams its model calls (OpenAI Responses API) from the scripted model server on loopback, through
a custom model provider; its tools, its sandbox and its session log are the real program's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import attempt_facts, by_id, run_record
from helpers.realclis import CODEX_MODEL, RUN_TIMEOUT_S, fleet_setup, transcript, watched_spans, write_plan
from helpers.realclis import codex_say as say
from helpers.realclis import codex_shell as shell
from helpers.repo import StellaRunner, git

from stellafleet.core.config import Config
from stellafleet.core.pricing import TokenUsage, price_for
from stellafleet.git import gitops
from stellafleet.testing.model_server import ScriptedModelServer


def price(input_tokens: int, output_tokens: int) -> float:
    pricer = price_for(CODEX_MODEL, Config({}))
    assert pricer is not None
    return pricer.cost(TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens))


def files_of(root: Path, sha: str) -> list[str]:
    return git("show", "--name-only", "--format=", sha, cwd=root).split()


def test_an_isolated_codex_task_commits_on_its_fleet_branch(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    steps = [
        shell("printf 'hello from codex\\n' > hello.txt"),
        shell("git add hello.txt && git commit -q -m 'Add hello.txt' && git log --oneline -1"),
        say("Added hello.txt and committed it."),
    ]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["codex"])
        base = gitops.head_commit(git_repo)
        plan = write_plan(
            tmp_path,
            [{"id": "hello", "prompt": "Add hello.txt", "pipeline": "codex", "isolation": "isolated"}],
        )
        proc = stella(
            "--spend-limit", "1", "fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0 and server.unknown == []
        assert all(r.wire == "responses" and r.streamed for r in server.requests)
        tools = {t.get("name") for t in server.requests[0].body["tools"]}
    assert "exec_command" in tools and "web_search" not in tools  # web search is off in a worker
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    (commit,) = record["commits"]
    assert attempt["outcome"] == "succeeded", attempt["summary"]
    assert attempt["summary"] == "Added hello.txt and committed it."
    # its thread, as Codex named it on `thread.started`, is a fact of the attempt
    (session,) = attempt_facts(git_repo, attempt["id"]).values()
    session_id = session["id"]
    assert session["tokens"] > 0 and session["cwd"] == attempt["worktree"]
    assert (
        session_id
        and session_id
        in (git_repo / ".stella/private/transcripts").joinpath(record["run"]["id"], "hello.jsonl").read_text()
    )
    branch = commit["branch"]
    assert branch.startswith("fleet/hello-")
    assert git("rev-list", f"{base}..{branch}", cwd=git_repo).split() == [commit["sha"]]
    assert files_of(git_repo, commit["sha"]) == ["hello.txt"]
    assert git("log", "-1", "--format=%s", commit["sha"], cwd=git_repo).strip() == "Add hello.txt"
    # its usage (the thread's totals over three model calls) priced into the ledger
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (10000, 180)
    assert attempt["spend_usd"] == pytest.approx(price(10000, 180))


def test_the_guard_stops_codex_between_model_calls(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    heavy = (200_000, 1_000)  # about a quarter dollar a call at gpt-5's price
    steps = [shell("true", heavy), shell("true", heavy)]
    # Later calls would go on; the slow answers leave the guard time to act before they arrive.
    steps += [shell("true", heavy, delay=3.0) for _ in range(4)]
    guard = 0.4
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["codex"])
        plan = write_plan(tmp_path, [{"id": "spender", "prompt": "Spend", "pipeline": "codex"}])
        proc = stella(
            "--spend-limit",
            str(guard),
            "fleet",
            "--plan",
            str(plan),
            cwd=git_repo,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
        # the second call's usage, already spent when the guard sees it, passes the limit: exit 3
        assert proc.returncode == 3, proc.stdout + proc.stderr
        served = len(server.requests)
    record = run_record(git_repo)
    assert record["run"]["reason"] == "spend limit passed: $0.52 recorded, over --spend-limit $0.40"
    (attempt,) = record["attempts"]
    assert attempt["outcome"] == "failed"
    assert attempt["summary"].startswith("codex was stopped: spend guard of $0.40 reached")
    # stopped after the second call's usage arrived in its session log, long before its turn ended
    assert served <= 3
    assert attempt["input_tokens"] == 400_000
    assert attempt["spend_usd"] == pytest.approx(price(400_000, 2_000))


def test_a_shared_codex_task_commits_through_stella_commit(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "scratch.txt").write_text("someone else's uncommitted work\n")
    question = {"id": "which", "header": "Which", "question": "Which file?", "options": []}
    ask = {"name": "request_user_input", "arguments": {"questions": [question]}}
    patch = "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: notes.txt\n+notes\n*** End Patch\nEOF\n"
    steps = [
        # a headless worker has no one to ask: Codex itself answers that it cannot
        {"tool_calls": [ask], "usage": {"input_tokens": 2000, "output_tokens": 30}},
        shell(patch, (3000, 50)),  # Codex applies the patch itself: a file_change item
        shell("stella commit -m 'Write the notes' notes.txt", (1000, 10)),
        say("Wrote notes.txt and committed it with stella commit.", (4000, 20)),
    ]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["codex"])
        base = gitops.head_commit(git_repo)
        plan = write_plan(tmp_path, [{"id": "notes", "prompt": "Write notes.txt", "pipeline": "codex"}])
        with watched_spans(git_repo) as spans:
            proc = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        answer = server.requests[1].body["input"][-1]
    assert answer["type"] == "function_call_output"
    assert answer["output"] == "request_user_input is unavailable in Default mode"
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    (commit,) = record["commits"]
    assert attempt["outcome"] == "succeeded", attempt["summary"]
    assert (commit["task_id"], commit["message"]) == ("notes", "Write the notes")
    assert git("rev-list", f"{base}..HEAD", cwd=git_repo).split() == [commit["sha"]]
    assert files_of(git_repo, commit["sha"]) == ["notes.txt"]
    assert (git_repo / "scratch.txt").exists()  # the other work was neither committed nor touched
    assert by_id(record["attempts"], "task_id")["notes"]["spend_usd"] == pytest.approx(price(10000, 110))
    # its write spans, from the items Codex printed: the patch's holds its write of notes.txt (without the
    # 50 ms edge unclaimed.py adds), and the commit's, right after it, closed when the command ended
    items = {
        e["item"]["type"]: f"codex-{e['item']['id']}"
        for e in transcript(git_repo, record["run"]["id"], "notes")
        if e.get("type") == "item.completed" and e["item"]["type"] in ("file_change", "command_execution")
    }
    patched, committed = (
        spans[attempt["id"], items["file_change"]],
        spans[attempt["id"], items["command_execution"]],
    )
    assert patched[1] is not None and patched[0] <= (git_repo / "notes.txt").stat().st_mtime_ns <= patched[1]
    assert committed[1] is not None and committed[1] >= patched[1]
    assert {span for _, span in spans} == set(items.values())


def test_what_an_isolated_codex_task_leaves_uncommitted_is_committed_for_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    steps = [shell("mkdir -p src && printf 'x = 1\\n' > src/left.py"), say("Wrote src/left.py.")]
    with ScriptedModelServer(steps) as server:
        env = fleet_setup(git_repo, server, ["codex"])
        plan = write_plan(
            tmp_path,
            [
                {
                    "id": "left",
                    "title": "Leave it",
                    "prompt": "Write it",
                    "pipeline": "codex",
                    "isolation": "isolated",
                }
            ],
        )
        proc = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    (commit,) = record["commits"]
    assert attempt["summary"].startswith("Wrote src/left.py.; committed what it left uncommitted in ")
    assert commit["branch"].startswith("fleet/left-")
    assert commit["message"] == "Leave it (codex, uncommitted changes)"
    assert files_of(git_repo, commit["sha"]) == ["src/left.py"]
