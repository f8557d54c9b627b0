"""A run's result document (`stella fleet --json`, every reporter's `finish`), from its read model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stellafleet.core.clock import wall_ms
from stellafleet.run.steps.factory import MIXED_PIPELINES
from stellafleet.state.views import run_model

ATTEMPT_KEYS = (
    "id",
    "outcome",
    "success",
    "exit_code",
    "started_at_ms",
    "finished_at_ms",
    "pid",
    "spend_usd",
    "input_tokens",
    "output_tokens",
    "steps",
    "summary",
    "error",
    "cpu_seconds",
    "peak_rss_bytes",
    "branch",
    "worktree",
    "log_path",
)
RUN_KEYS = ("status", "exit_code", "reason", "base_ref", "base_commit", "max_concurrency")


def _task_result(task: Mapping[str, Any], run_pipeline: str | None) -> dict[str, Any]:
    attempts = [{key: attempt[key] for key in ATTEMPT_KEYS} for attempt in task["attempts"]]
    ran = task["attempts"][-1].get("pipeline") if task["attempts"] else None
    default = run_pipeline if run_pipeline != MIXED_PIPELINES else None
    return {
        **{key: task[key] for key in ("id", "title", "wave", "status", "reason", "isolation")},
        "pipeline": task["pipeline"] or ran or default,
        **{key: task[key] for key in ("depends_on", "expands", "parent", "claims", "branch", "worktree")},
        "spend_usd": round(task["spend_usd"], 6),
        "summary": attempts[-1]["summary"] if attempts else None,
        "commits": [commit["sha"] for commit in task["commits"]],
        "no_commits": task["no_commits"],  # succeeded, isolated, and its branch holds nothing of its own
        "attempts": attempts,
    }


def result_document(record: dict[str, Any], watch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine-readable result of a run, from the ledger's record of it (Ledger.get_run)."""
    model = run_model(record, now_ms=wall_ms())
    run = model["run"]
    return {
        # the header `stella runs RUN --json` has; a run just finished is resumed by none yet
        "run": {**run, "resumed_by": []},
        # the earlier shape's top-level fields, kept for compatibility: the same values as run.*
        "run_id": run["id"],
        **{key: run[key] for key in RUN_KEYS},
        "spend_usd": round(run["spend_usd"], 6),
        "spend_limit_usd": run["spend_limit_usd"],
        "created_at_ms": run["created_at_ms"],
        "finished_at_ms": run["finished_at_ms"],
        "schedule": run["schedule"],
        "resumed_from": run["resumed_from"],
        "tasks": [_task_result(task, run["pipeline"]) for task in model["tasks"]],
        "branches": [
            {"branch": entry["branch"], "tasks": entry["tasks"], "commits": entry["commits"]}
            for entry in model["branches"]
        ],
        "watch": dict(watch) if watch is not None else None,
    }
