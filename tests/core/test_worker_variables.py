"""The worker variables a fleet clears from its own environment are exactly the ones a worker reads."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from stellafleet.core.config import CONFIG_VARIABLES
from stellafleet.core.workercontext import WorkerContext
from stellafleet.run.dispatch import RunSettings, run_env, task_env
from stellafleet.run.executor import WORKER_VARIABLES


def full_context(tmp_path: Path) -> WorkerContext:
    """A context with every optional field set, so every variable is written (its prompt file too)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "prompt.txt").write_text("Rewrite docs/receipts.md")
    return WorkerContext(
        root=tmp_path,
        workspace=tmp_path / "wt",
        run_id="r-20261130-120000-abcd",
        task_id="docs",
        task_title="Rewrite the receipts page",
        attempt_id=7,
        prompt="Rewrite docs/receipts.md",
        isolation="isolated",
        branch="fleet/docs-0123456789abcdef",
        base_commit="f" * 40,
        spend_guard_usd=1.5,
        pipeline="command",
        model="m",
        timeout_s=30.0,
        result_path=tmp_path / "result.json",
        log_path=tmp_path / "docs.log",
        transcript_path=tmp_path / "docs.jsonl",
        prompt_path=tmp_path / "prompt.txt",
        token="0123456789abcdef",
        plan_out=tmp_path / "fragment.plan",
        allow_detached=True,
        start_commit="e" * 40,
        serialize_hooks=True,
    )


def test_every_field_has_one_variable_and_to_env_writes_exactly_those(tmp_path: Path) -> None:
    names = WorkerContext.env_names()
    assert len(names) == len(set(names)) == len(fields(WorkerContext))
    assert set(full_context(tmp_path).to_env()) == set(names)


def test_a_worker_inherits_none_of_the_fleets_own_worker_variables(tmp_path: Path) -> None:
    # `stella fleet` started from inside a worker (a command pipeline running a fleet) must not hand that
    # worker's task or result file on to its own workers.
    outer = full_context(tmp_path / "outer")
    inherited = {
        **outer.to_env(),
        "STELLA_COMMAND_RESULT": str(tmp_path / "outer-result.json"),
        "STELLA_SPEND_LIMIT": "5",
        "KEEP": "yes",
    }
    settings = RunSettings(
        root=tmp_path, run_id="r-1", base_commit="0" * 40, default_pipeline="command", config_file=None
    )
    env = run_env(settings, base=inherited)
    assert {key for key in env if key.startswith("STELLA_")} == {"STELLA_SPEND_LIMIT"}
    assert env["KEEP"] == "yes"
    inner = full_context(tmp_path / "inner")
    worker = task_env(inner, env)
    assert WorkerContext.from_env(worker) == inner


def test_no_worker_variable_shares_a_name_with_a_config_variable() -> None:
    # The fleet clears every worker variable from what its workers inherit: one named like a config
    # variable (the task's model once was STELLA_MODEL) would take the user's config away from every worker.
    assert set(WORKER_VARIABLES) & set(CONFIG_VARIABLES) == set()
    assert "STELLA_TASK_MODEL" in WorkerContext.env_names()


def test_a_fleet_hands_every_config_variable_on_to_its_workers(tmp_path: Path) -> None:
    user = {name: f"value of {name}" for name in CONFIG_VARIABLES}
    settings = RunSettings(root=tmp_path, run_id="r-1", base_commit="0" * 40, default_pipeline="plain")
    env = run_env(settings, base=user)
    assert {name: env[name] for name in CONFIG_VARIABLES} == user
    worker = task_env(full_context(tmp_path), env)
    assert {name: worker[name] for name in CONFIG_VARIABLES} == user
