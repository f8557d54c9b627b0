"""A check that runs git (`git stash`, `git add`, `git commit`, as a test suite does) runs the real git: the
git guard of its task's worker is no part of the check's environment, for a shared task and an isolated
one (whose guard, when commit hooks are serialised, diverts `git commit`), nor of `stella merge`'s check
when a shared worker runs `stella merge`."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, by_id, make_attempt, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.git import guard
from stellafleet.state.ledger import Ledger

WORKER = """\
(WS / f"{TASK}.txt").write_text("done\\n")
stella_commit(TASK, f"{TASK}.txt")
"""

# In the check's tree: reads, a stash and an add of nothing; then a commit in a repository of its own.
CHECK = (
    'git stash list && git add -A && git stash && scratch=$(mktemp -d) && git init -q "$scratch" && '
    'git -C "$scratch" -c user.name=check -c user.email=check@example.invalid commit -q --allow-empty '
    '-m probe && git -C "$scratch" log --format=%s && rm -rf "$scratch" && echo checked'
)
TIMEOUT_S = 20  # a guard that loops fails the check here, not after the default 600 s

PLAN = "".join(
    f'[[tasks]]\nid = "{task}"\nprompt = "add {task}.txt"\nclaims = ["{task}.txt"]\nisolation = "{task}"\n'
    f"check = {json.dumps(CHECK)}\ncheck_timeout = {TIMEOUT_S}\n\n"
    for task in ("shared", "isolated")
)


def test_a_check_running_git_add_stash_and_commit_passes_in_shared_and_isolated_tasks(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    write_config(git_repo, run=scripts.python("work", WORKER), extra="[commit]\nserialize_hooks = true\n")
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)

    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)

    record = run_record(git_repo)
    checks = by_id(record["checks"], key="task_id")
    assert ran.returncode == 0, (ran.stdout + ran.stderr, checks)
    assert {task: by_id(record["tasks"])[task]["status"] for task in ("shared", "isolated")} == {
        "shared": "succeeded",
        "isolated": "succeeded",
    }
    for check in (checks["shared"], checks["isolated"]):
        assert check["passed"] and check["output_tail"].endswith("probe\nchecked\n"), check
        assert check["duration_ms"] < TIMEOUT_S * 1000 / 2

    # `stella merge` from a shared worker's shell: its environment holds the worker's guard and context
    worker = make_attempt(git_repo, "another")
    env = guard.guarded_env(worker.to_env(), guard.install(worker.paths.private / "gitguard"))
    merged = stella_main("merge", "--unwatched", "--json", cwd=git_repo, env=env)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    with Ledger.open(worker.paths.fleet_db, readonly=True) as ledger:
        [again] = [row for row in ledger.checks.of_run(record["run"]["id"]) if row["phase"] == "merge"]
    assert again["passed"] and again["output_tail"].endswith("probe\nchecked\n"), again
