"""Each agent pipeline tells the fleet of the limits its real CLI reports, read from the CLI's own output:
against a scripted server answering a usage limit two hours away, the task ends skipped with the reset,
the one after it never starts, and the run exits 3; Claude Code's rate-limit retries narrow the fleet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.fleet import by_id, run_record
from helpers.realclis import PIPELINES, RUN_TIMEOUT_S, fleet_setup, say, write_plan
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths
from stellafleet.state.ledger import Ledger
from stellafleet.testing.model_server import RateLimit, ScriptedModelServer, UsageLimit


def limit_rows(root: Path) -> list[dict]:
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.limits.of_run(ledger.runs.resolve(None))


@pytest.mark.parametrize("cli", ["claude", "codex", "aider"])
def test_a_far_usage_limit_from_the_real_cli_skips_the_rest_and_exits_3(
    cli: str, git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    pipeline = PIPELINES[cli]
    # aider's provider library retries a refused call twice on its own before aider reports it
    with ScriptedModelServer([say("done")] * 4, usage_limit=UsageLimit(calls=8, reset_in=7200)) as server:
        env = fleet_setup(git_repo, server, [cli])
        plan = write_plan(
            tmp_path,
            [{"id": "first", "prompt": "say hi", "pipeline": pipeline},
             {"id": "second", "prompt": "say hi again", "pipeline": pipeline}],
        )  # fmt: skip
        proc = stella(
            "fleet",
            "--plan",
            str(plan),
            "--max-concurrency",
            "1",
            cwd=git_repo,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
    record = run_record(git_repo)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert record["run"]["status"] == "usage_limited"
    tasks = by_id(record["tasks"])
    assert {task["status"] for task in tasks.values()} == {"skipped"}, tasks
    hour = time.strftime("%Y-%m-%d %H:", time.gmtime(time.time() + 7200))
    for task in tasks.values():
        assert task["reason"].startswith("usage limit reached (resets "), task["reason"]
        assert hour in task["reason"] or cli == "codex", task["reason"]  # codex names it to the minute
    assert [attempt["task_id"] for attempt in record["attempts"]] == ["first"]  # second never started
    usage = [row for row in limit_rows(git_repo) if row["kind"] == "usage"]
    assert usage and usage[0]["source"] == pipeline and usage[0]["task_id"] == "first"
    assert usage[0]["reset_at_ms"] > (time.time() + 6000) * 1000


def test_claude_codes_rate_limit_retries_narrow_the_fleet_and_the_task_succeeds(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    with ScriptedModelServer([say("done")] * 4, rate_limit=RateLimit(calls=2, retry_after=1.0)) as server:
        env = fleet_setup(git_repo, server, ["claude"])
        plan = write_plan(
            tmp_path,
            [{"id": "a", "prompt": "say hi", "pipeline": "claude-code"},
             {"id": "b", "prompt": "say hi too", "pipeline": "claude-code"}],
        )  # fmt: skip
        proc = stella(
            "fleet",
            "--plan",
            str(plan),
            "--max-concurrency",
            "2",
            cwd=git_repo,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = limit_rows(git_repo)
    rates = [row for row in rows if row["kind"] == "rate"]
    assert rates and {row["source"] for row in rates} == {"claude-code"}
    assert all(row["status"] == 429 and row["reset_at_ms"] for row in rates)
    widths = [row["concurrency"] for row in rows if row["kind"] == "concurrency"]
    assert widths and min(widths) == 1


@pytest.mark.parametrize("cli", ["claude", "codex", "aider"])
def test_max_spend_caps_the_real_clis_task_and_is_its_recorded_guard(
    cli: str, git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    pipeline = PIPELINES[cli]
    # each call costs more than the task's cap: 200k input tokens (Claude Code and aider price their own
    # calls; stella prices Codex's at its model's price)
    heavy = {"text": "still thinking", "usage": {"input_tokens": 200_000, "output_tokens": 50}}
    with ScriptedModelServer([heavy] * 6) as server:
        env = fleet_setup(git_repo, server, [cli])
        plan = write_plan(
            tmp_path, [{"id": "capped", "prompt": "say hi", "pipeline": pipeline, "max_spend": 0.01}]
        )
        proc = stella("fleet", "--plan", str(plan), cwd=git_repo, env=env, timeout=RUN_TIMEOUT_S)
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    assert attempt["guard_usd"] == pytest.approx(0.01), proc.stdout + proc.stderr
    assert attempt["spend_usd"] > 0
    assert len(server.requests) <= 2, len(server.requests)  # stopped at the first call past the cap
    if cli == "claude":
        assert "spend guard of $0.01" in (attempt["summary"] or ""), attempt
