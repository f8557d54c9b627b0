"""`stella commit` acts only for the attempt it runs inside: a copied or made-up worker environment is
refused with exit 2 and one line, and nothing is committed or recorded."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from helpers.fleet import RUN, make_attempt, wait_until
from helpers.repo import StellaRunner, git

from stellafleet.state.ledger import Ledger


def commits(root: Path) -> list[dict]:
    with Ledger.open(root / ".stella/private/fleet.db", readonly=True) as ledger:
        return ledger.get_run(RUN)["commits"]


def refused(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_another_attempts_copied_environment_is_refused(git_repo: Path, stella: StellaRunner) -> None:
    victim = make_attempt(git_repo, "victim")
    (git_repo / "claimed.txt").write_text("not yours\n")
    copied = {k: v for k, v in victim.to_env().items() if k != "STELLA_ATTEMPT_PROOF"}
    refused(stella("commit", "-m", "steal", "claimed.txt", cwd=git_repo, env=copied), "STELLA_ATTEMPT_PROOF")
    wrong = {**victim.to_env(), "STELLA_ATTEMPT_PROOF": "0" * 32}
    refused(stella("commit", "-m", "steal", "claimed.txt", cwd=git_repo, env=wrong), "STELLA_ATTEMPT_PROOF")
    assert git("rev-list", "--count", "HEAD", cwd=git_repo).strip() == "1"
    assert commits(git_repo) == []


def test_the_whole_environment_copied_out_of_a_running_worker_is_refused(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    """The secret too: the attempt's worker is a live process that did not start this `stella commit`;
    the same command started by that worker is accepted."""
    ctx = make_attempt(git_repo, "victim")
    go, rc = tmp_path / "go", tmp_path / "rc"
    script = (
        f"while [ ! -e {go} ]; do sleep 0.02; done; "
        f"{sys.executable} -m stellafleet commit -m mine claimed.txt; echo $? > {rc}; sleep 60"
    )
    worker = subprocess.Popen(["sh", "-c", script], cwd=git_repo, env={**os.environ, **ctx.to_env()})
    try:
        with Ledger.open(ctx.paths.fleet_db) as ledger:
            ledger.attempts.set_pid(ctx.attempt_id, worker.pid)
        (git_repo / "claimed.txt").write_text("not yours\n")
        proc = stella("commit", "-m", "steal", "claimed.txt", cwd=git_repo, env=ctx.to_env())
        refused(proc, f"not started by the worker of attempt {ctx.attempt_id}")
        assert commits(git_repo) == []
        go.touch()
        # the whole line written: the event itself, not a guess at how long echo takes
        wait_until(lambda: rc.exists() and rc.read_text().endswith("\n"), f"{rc} written", process=worker)
        assert rc.read_text().strip() == "0"
    finally:
        worker.kill()
        worker.wait()
    assert [row["message"] for row in commits(git_repo)] == ["mine"]


def test_a_made_up_run_or_attempt_is_refused(git_repo: Path, stella: StellaRunner) -> None:
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    for forged in (
        dataclasses.replace(ctx, run_id="r-20990101-000000-dead"),
        dataclasses.replace(ctx, attempt_id=ctx.attempt_id + 100),
        dataclasses.replace(ctx, task_id="someone-else"),
    ):
        refused(
            stella("commit", "-m", "x", "a.txt", cwd=git_repo, env=forged.to_env()), "not in the fleet ledger"
        )
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        assert ledger.runs.page()[0]["id"] == RUN and ledger.runs.count() == 1
    assert commits(git_repo) == []
    # the genuine attempt still commits
    ok = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert ok.returncode == 0, ok.stderr


def test_a_bad_spend_guard_is_a_clear_usage_error(git_repo: Path, stella: StellaRunner) -> None:
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    for value in ("abc", "nan", "-1"):
        env = {**ctx.to_env(), "STELLA_SPEND_GUARD": value}
        refused(
            stella("commit", "-m", "x", "a.txt", cwd=git_repo, env=env), "STELLA_SPEND_GUARD is not a number"
        )
