"""Shared set-up for the engine tests: a real repository, a ledger attempt, a config, a run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.fleet import RUN, worker_context
from stellafleet.core.config import Config
from stellafleet.core.spend import SpendTally
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.plain import PlainPipeline
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock
from stellafleet.testing.model_server import ScriptedModelServer
from stellafleet.testing.sample_ledger import add_run

RUN_ID = RUN


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    gitops.git("init", "-q", "-b", "main", cwd=path)
    gitops.git("config", "user.name", "Test", cwd=path)
    gitops.git("config", "user.email", "test@example.invalid", cwd=path)
    gitops.git("config", "commit.gpgsign", "false", cwd=path)
    for rel, text in (
        files or {"README.md": "# demo\n", "src/app.py": "def answer():\n    return 41\n"}
    ).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    gitops.git("add", "-A", cwd=path)
    gitops.git("commit", "-q", "-m", "init", cwd=path)
    gitops.ensure_excluded(path, [".stella/private/", ".stella/worktrees/"])
    return path


def engine_config(
    server: ScriptedModelServer | None,
    provider: str = "openai",
    *,
    model: str = "scripted-model",
    prices: dict[str, float] | None = None,
    **engine: Any,
) -> Config:
    table: dict[str, Any] = {"provider": provider, "model": model, "max_retries": 2, **engine}
    if server is not None:
        table["base_url"] = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    data: dict[str, Any] = {"engine": table}
    if prices is not None:
        data["prices"] = {model: prices}
    return Config(data)


def make_context(
    root: Path,
    *,
    task_id: str = "t1",
    title: str = "demo task",
    prompt: str = "do the thing",
    guard: float | None = None,
    run_id: str = RUN_ID,
) -> WorkerContext:
    """A ledger run (if new), task and attempt for one engine worker in the shared tree at root."""
    with Ledger.open(root / ".stella" / "private" / "fleet.db") as ledger:
        if run_id not in [r["id"] for r in ledger.runs.page()]:
            add_run(
                ledger,
                run_id,
                base_ref="HEAD",
                base_commit=gitops.head_commit(root),
                max_concurrency=2,
                spend_limit_usd=guard,
                pipeline="plain",
                argv=["test"],
                root=str(root),
            )
        ledger.tasks.add(run_id, [PlanTask(id=task_id, prompt=prompt, title=title)], {task_id: 1})
        attempt = ledger.attempts.start(run_id, task_id, pipeline="plain")
    return worker_context(
        root,
        run_id=run_id,
        task_id=task_id,
        attempt_id=attempt,
        pipeline="plain",
        title=title,
        prompt=prompt,
        base_commit=gitops.head_commit(root),
        branch="main",
        guard=guard,
    )


@dataclass
class EngineRun:
    result: PipelineResult
    spend: SpendTally
    clock: FakeClock
    events: list[tuple[str, dict[str, Any]]]

    def tool_results(self) -> list[dict[str, Any]]:
        return [data for kind, data in self.events if kind == "tool"]


def run_engine(
    ctx: WorkerContext, config: Config, *, env: dict[str, str] | None = None, clock: FakeClock | None = None
) -> EngineRun:
    clock = clock or FakeClock()
    spend = SpendTally()
    events: list[tuple[str, dict[str, Any]]] = []
    result = PlainPipeline().run(
        ctx, config, spend, clock=clock, env=env or {}, events=lambda kind, data: events.append((kind, data))
    )
    return EngineRun(result, spend, clock, events)


def transcript_records(ctx: WorkerContext) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ctx.transcript_path.read_text().splitlines()]


def tool_messages(body: dict[str, Any]) -> list[str]:
    """The tool results the engine sent in one recorded request, in either wire format."""
    out: list[str] = []
    for message in body["messages"]:
        if message["role"] == "tool":
            out.append(message["content"])
        elif message["role"] == "user" and isinstance(message["content"], list):
            out.extend(b["content"] for b in message["content"] if b.get("type") == "tool_result")
    return out


# A model session that writes hello.txt, commits it and finishes: the engine's happy path.
HELLO_SESSION: list[dict[str, Any]] = [
    {
        "text": "Adding the file.",
        "tool_calls": [{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hello\n"}}],
        "usage": {"input_tokens": 2000, "output_tokens": 100},
    },
    {
        "tool_calls": [{"name": "commit", "arguments": {"message": "Add hello.txt"}}],
        "usage": {"input_tokens": 2200, "output_tokens": 50},
    },
    {
        "tool_calls": [{"name": "finish", "arguments": {"summary": "Added hello.txt."}}],
        "usage": {"input_tokens": 2300, "output_tokens": 40},
    },
]
