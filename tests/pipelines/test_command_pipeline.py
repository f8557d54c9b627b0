"""The `command` pipeline: a configured shell command per task, run in the task's workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendTally
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines import load
from stellafleet.pipelines.command import RESULT_ENV, CommandPipeline


def context(tmp_path: Path, task_id: str = "t1", prompt: str = "Fix the parser") -> WorkerContext:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    private = tmp_path / "private"
    return WorkerContext(
        root=tmp_path,
        workspace=workspace,
        run_id="r-20261130-120000-abcd",
        task_id=task_id,
        task_title=prompt,
        attempt_id=7,
        prompt=prompt,
        isolation="shared",
        branch=None,
        base_commit="0" * 40,
        spend_guard_usd=1.5,
        pipeline="command",
        model=None,
        timeout_s=None,
        result_path=private / "results" / f"{task_id}-7.json",
        log_path=private / "logs" / f"{task_id}.log",
        transcript_path=private / "transcripts" / f"{task_id}.jsonl",
    )


def config(run: str | None = None, **tasks: str) -> Config:
    section: dict[str, object] = {}
    if run is not None:
        section["run"] = run
    if tasks:
        section["tasks"] = {task: {"run": command} for task, command in tasks.items()}
    return Config({"pipelines": {"command": section}})


def test_it_is_installed_as_the_command_entry_point() -> None:
    pipeline = load("command")
    assert isinstance(pipeline, CommandPipeline)
    assert pipeline.name == "command" and pipeline.version() is None


def test_preflight_says_how_to_configure_the_command() -> None:
    problem = CommandPipeline().preflight(Config())
    assert problem is not None and "[pipelines.command]" in problem and "run = " in problem
    assert CommandPipeline().preflight(config("true")) is None
    assert CommandPipeline().preflight(config(None, t1="true")) is None


def test_success_runs_in_the_workspace_with_the_task_in_its_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = context(tmp_path)
    command = (
        'pwd > where; printf "%s|%s|%s|%s" "$STELLA_PROMPT" "$STELLA_TASK_ID" "$STELLA_RUN_ID" '
        '"$STELLA_SPEND_GUARD" > env; echo "$STELLA_COMMAND_RESULT" > result-path; echo first; echo; '
        "echo '  the last line  '; echo"
    )
    spend = SpendTally()
    result = CommandPipeline().run(ctx, config(command), spend)
    assert result.success and result.error is None
    assert result.summary == "the last line"
    assert Path((ctx.workspace / "where").read_text().strip()).resolve() == ctx.workspace.resolve()
    assert (ctx.workspace / "env").read_text() == "Fix the parser|t1|r-20261130-120000-abcd|1.500000"
    assert (ctx.workspace / "result-path").read_text().strip().endswith(".command.json")
    assert "first" in capsys.readouterr().out  # the command's output goes to the worker's log
    assert spend.usd == 0.0


def test_a_result_file_reports_spend_and_summary(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    report = {
        "spend_usd": 0.12,
        "summary": "added 3 tests",
        "input_tokens": 1200,
        "output_tokens": 80,
        "steps": 4,
    }
    command = f"echo noise; cat > \"${RESULT_ENV}\" <<'EOF'\n{json.dumps(report)}\nEOF"
    spend = SpendTally()
    result = CommandPipeline().run(ctx, config(command), spend)
    assert result.success and result.summary == "added 3 tests"
    assert (spend.usd, spend.input_tokens, spend.output_tokens, spend.steps) == (0.12, 1200, 80, 4)
    assert (result.spend_usd, result.steps) == (0.12, 4)


def test_a_failing_command_fails_with_its_status_and_keeps_its_last_words(tmp_path: Path) -> None:
    result = CommandPipeline().run(
        context(tmp_path), config("echo 'no parser found' >&2; exit 4"), SpendTally()
    )
    assert not result.success
    assert result.summary == "no parser found"
    assert result.error == "command failed: exit status 4"
    killed = CommandPipeline().run(context(tmp_path), config("kill -9 $$"), SpendTally())
    assert not killed.success and killed.error == "command failed: killed by signal SIGKILL"


def test_a_bad_result_file_fails_the_task_clearly(tmp_path: Path) -> None:
    not_json = CommandPipeline().run(
        context(tmp_path), config(f'echo "{{oops" > "${RESULT_ENV}"'), SpendTally()
    )
    assert not not_json.success and "is not JSON" in not_json.summary
    negative = CommandPipeline().run(
        context(tmp_path), config(f'echo \'{{"spend_usd": -1}}\' > "${RESULT_ENV}"'), SpendTally()
    )
    assert not negative.success and "spend_usd must be a non-negative number" in negative.summary
    a_list = CommandPipeline().run(context(tmp_path), config(f'echo "[1]" > "${RESULT_ENV}"'), SpendTally())
    assert not a_list.success and "must hold a JSON object" in a_list.summary


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_result_file_with_a_non_finite_number_fails_the_task_clearly(tmp_path: Path, literal: str) -> None:
    # Python's json reads NaN and Infinity; a NaN spend once reached the ledger as a NOT NULL
    # IntegrityError, and an infinite one stopped the whole fleet at "$inf of $5.00".
    spent: list[float] = []

    class Recorder(SpendTally):
        def add(self, usd: float, **counts: int) -> None:
            spent.append(usd)

    for key in ("spend_usd", "input_tokens"):
        command = config(f'echo \'{{"{key}": {literal}}}\' > "${RESULT_ENV}"')
        result = CommandPipeline().run(context(tmp_path), command, Recorder())
        assert not result.success and f"{key} must be a non-negative number" in result.summary
    assert spent == []


def test_a_task_may_have_its_own_command(tmp_path: Path) -> None:
    cfg = config("echo default", **{"docs.v2": "echo special"})
    assert cfg.pipelines.command.command_for("docs.v2") == "echo special"
    assert cfg.pipelines.command.command_for("other") == "echo default"
    assert CommandPipeline().run(context(tmp_path, "docs.v2"), cfg, SpendTally()).summary == "special"
    only_tasks = config(None, t9="echo nine")
    missing = CommandPipeline().run(context(tmp_path, "t1"), only_tasks, SpendTally())
    assert not missing.success and 'no command for task "t1"' in missing.summary


def test_the_command_gets_no_terminal_input(tmp_path: Path) -> None:
    result = CommandPipeline().run(context(tmp_path), config("cat; echo read-nothing"), SpendTally())
    assert result.success and result.summary == "read-nothing"
