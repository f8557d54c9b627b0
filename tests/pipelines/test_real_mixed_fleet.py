"""One real `stella fleet` mixing pipelines per task, each agent task run by its real CLI:
claude-code -> command -> codex, with an aider task in parallel, all against one scripted model server."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, run_record, toml_str
from helpers.realclis import RUN_TIMEOUT_S, bash, fleet_setup, say, write, write_plan
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops
from stellafleet.testing.model_server import ScriptedModelServer

FORMATTER = """\
app = WS / "app.py"
lines = [" ".join(line.split()) for line in app.read_text().splitlines()]
app.write_text("\\n".join(lines) + "\\n")
sha = stella_commit("Format app.py", "app.py")
report(summary=f"formatted app.py in {sha[:12]}")
"""


def codex_shell(cmd: str) -> dict[str, object]:
    call = {"name": "exec_command", "arguments": {"cmd": cmd}}
    return {"tool_calls": [call], "usage": {"input_tokens": 3000, "output_tokens": 80}}


def test_a_plan_mixing_the_real_clis_runs_each_task_through_its_own(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    app = str(git_repo / "app.py")
    scripts = {
        "TASK-DRAFT": [
            write(app, "x   =   1\ny =    2\n"),
            bash("stella commit -m 'Draft app.py' app.py"),
            say("Drafted app.py."),
        ],
        "TASK-REVIEW": [
            codex_shell(
                "printf 'app.py sets x and y\\n' > REVIEW.md && stella commit -m 'Review app.py' REVIEW.md"
            ),
            {"text": "Reviewed app.py.", "usage": {"input_tokens": 4000, "output_tokens": 20}},
        ],
        "TASK-NOTES": [
            {
                "text": "NOTES.md\n```\nthe app is being drafted\n```\n",
                "usage": {"input_tokens": 1500, "output_tokens": 30},
            }
        ],
    }
    command = Scripts(tmp_path / "scripts").python("fmt", FORMATTER)
    with ScriptedModelServer([], scripts=scripts) as server:
        env = fleet_setup(
            git_repo,
            server,
            ["claude", "codex", "aider"],
            extra_config=f"[pipelines.command]\nrun = {toml_str(command)}\n",
        )
        base = gitops.head_commit(git_repo)
        plan = write_plan(
            tmp_path,
            [
                {"id": "draft", "prompt": "TASK-DRAFT: draft app.py", "pipeline": "claude-code"},
                {"id": "format", "prompt": "Format app.py", "pipeline": "command", "depends_on": ["draft"]},
                {"id": "review", "prompt": "TASK-REVIEW", "pipeline": "codex", "depends_on": ["format"]},
                {
                    "id": "notes",
                    "title": "Notes",
                    "prompt": "TASK-NOTES: write NOTES.md",
                    "pipeline": "aider",
                },
            ],
        )
        proc = stella(
            "--spend-limit", "2", "fleet", "--plan", str(plan), "--max-concurrency", "2",
            cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0 and server.unknown == []
        wires = {r.wire for r in server.requests}
    assert wires == {"anthropic", "responses", "openai"}

    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert {t: task["status"] for t, task in tasks.items()} == dict.fromkeys(
        ["draft", "format", "review", "notes"], "succeeded"
    )
    attempts = by_id(record["attempts"], "task_id")
    assert {t: a["pipeline"] for t, a in attempts.items()} == {
        "draft": "claude-code",
        "format": "command",
        "review": "codex",
        "notes": "aider",
    }
    for task in ("draft", "review", "notes"):
        assert attempts[task]["spend_usd"] > 0, task
    assert record["run"]["spend_usd"] == pytest.approx(sum(a["spend_usd"] for a in record["attempts"]))
    assert (git_repo / "app.py").read_text() == "x = 1\ny = 2\n"  # the formatter ran after the draft

    commits = by_id(record["commits"], "sha")
    history = git("rev-list", "--reverse", f"{base}..HEAD", cwd=git_repo).split()
    order = [commits[sha]["task_id"] for sha in history]
    chain = [task for task in order if task != "notes"]
    assert chain == ["draft", "format", "review"] and order.count("notes") == 1
    expected = {"draft": ["app.py"], "format": ["app.py"], "review": ["REVIEW.md"], "notes": ["NOTES.md"]}
    for sha in history:
        files = git("show", "--name-only", "--format=", sha, cwd=git_repo).split()
        assert files == expected[commits[sha]["task_id"]]
    assert git("status", "--porcelain", cwd=git_repo) == ""
