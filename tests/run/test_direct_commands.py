"""`[pipelines.command] direct = true`: the same ledger rows as with a worker process, at less cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import by_id, file_locks, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.core.config import Config
from stellafleet.core.paths import StatePaths
from stellafleet.run.direct import BUILTIN_ENTRY, covers_every_task

REPORT = (
    'printf \'{"spend_usd": 0.25, "input_tokens": 7, "output_tokens": 3, "steps": 2, '
    '"summary": "ok done"}\' > "$STELLA_COMMAND_RESULT"'
)
COMMANDS = {
    "reported": REPORT,
    "last-line": "echo one; echo; echo last words",
    "failing": "echo oops; exit 3",
    "bad-report": 'echo nope > "$STELLA_COMMAND_RESULT"',
    "slow": "sleep 30",
    "after-failing": "true",
}
PLAN = """\
[[tasks]]
id = "reported"
prompt = "p"
claims = ["a.txt"]

[[tasks]]
id = "last-line"
prompt = "p"

[[tasks]]
id = "failing"
prompt = "p"

[[tasks]]
id = "after-failing"
prompt = "p"
depends_on = ["failing"]

[[tasks]]
id = "bad-report"
prompt = "p"

[[tasks]]
id = "slow"
prompt = "p"
timeout = 1
"""
TASK_KEYS = ("status", "reason")
ATTEMPT_KEYS = (
    "outcome", "success", "exit_code", "summary", "error",
    "spend_usd", "input_tokens", "output_tokens", "steps",
)  # fmt: skip


def _rows(record: dict[str, Any]) -> dict[str, Any]:
    tasks = {t["id"]: {k: t[k] for k in TASK_KEYS} for t in record["tasks"]}
    attempts = {a["task_id"]: {k: a[k] for k in ATTEMPT_KEYS} for a in record["attempts"]}
    return {"tasks": tasks, "attempts": attempts, "spend": record["run"]["spend_usd"]}


@pytest.mark.parametrize("fork", ["true", "false"])
def test_direct_commands_leave_the_same_ledger_rows_as_workers(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, fork: str
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    rows = {}
    for direct in ("false", "true"):
        extra = f"[fleet]\nstop_grace = 1\nfork_workers = {fork}\n"
        write_config(git_repo, run="true", tasks=COMMANDS, extra=extra)
        config = StatePaths(git_repo).config_file
        config.write_text(
            config.read_text().replace(
                "[pipelines.command]\n", f"[pipelines.command]\ndirect = {direct}\n", 1
            )
        )
        proc = stella(
            "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "3", cwd=git_repo
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        record = run_record(git_repo)
        rows[direct] = _rows(record)
        log = Path(by_id(record["attempts"], "task_id")["last-line"]["log_path"]).read_text()
        assert ("stella worker:" in log) is (direct == "false"), log
        assert file_locks(git_repo) == []

    assert rows["true"] == rows["false"]
    attempts = rows["true"]["attempts"]
    assert attempts["reported"]["summary"] == "ok done" and attempts["reported"]["spend_usd"] == 0.25
    assert attempts["last-line"]["summary"] == "last words"
    assert (
        attempts["failing"]["error"] == "command failed: exit status 3"
        and attempts["failing"]["exit_code"] == 1
    )
    assert rows["true"]["tasks"]["after-failing"] == {
        "status": "skipped",
        "reason": "dependency failed: failing",
    }
    assert attempts["bad-report"]["error"].startswith("STELLA_COMMAND_RESULT file is not JSON")
    assert rows["true"]["tasks"]["slow"]["reason"].startswith("timed out after 1s (worker killed by signal")
    assert rows["true"]["spend"] == 0.25


def test_a_run_needs_no_worker_launcher_only_when_direct_commands_run_every_task() -> None:
    direct = Config({"pipelines": {"command": {"run": "true", "direct": True}}})
    command = {"command": BUILTIN_ENTRY}
    assert covers_every_task(direct, command)
    assert covers_every_task(Config({"pipelines": {"command": {"run": "true"}}}), command)  # the default
    worker = Config({"pipelines": {"command": {"run": "true", "direct": False}}})
    assert not covers_every_task(worker, command)
    assert not covers_every_task(direct, {**command, "aider": "stellafleet.pipelines.aider:AiderPipeline"})
    assert not covers_every_task(direct, {"command": "somewhere.else:CommandPipeline"})  # not the built-in
