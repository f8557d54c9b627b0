"""A real fleet readies an isolated task's worktree: `.worktreeinclude` files and `[worktree] setup`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths

# The worker: what it found in its worktree, and the index it was given.
LOOK = """\
mark(f"{TASK}.env", (WS / ".env").read_text() if (WS / ".env").exists() else "<missing>")
mark(f"{TASK}.setup", (WS / "setup.out").read_text() if (WS / "setup.out").exists() else "<missing>")
mark(f"{TASK}.index", os.environ.get("STELLA_WORKTREE_INDEX", "<unset>"))
wait_file(MARKS / ("b.index" if TASK == "a" else "a.index"))  # both live at once: their numbers differ
"""


def _repo_with_env(root: Path) -> None:
    (root / ".gitignore").write_text(".env\nsetup.out\n")
    (root / ".worktreeinclude").write_text(".env\n")
    git("add", ".gitignore", ".worktreeinclude", cwd=root)
    git("commit", "-q", "-m", "env", cwd=root)
    (root / ".env").write_text("API_URL=http://localhost\n")


def test_an_isolated_task_sees_its_included_files_and_its_setups_output(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    _repo_with_env(git_repo)
    marks = tmp_path / "marks"
    marks.mkdir()
    setup = 'echo "installed for $STELLA_TASK_ID on $STELLA_WORKTREE_INDEX" | tee setup.out; test -f .env'
    write_config(
        git_repo,
        run=Scripts(tmp_path / "scripts").python("look", LOOK),
        extra=f"[worktree]\nsetup = {json.dumps(setup)}\n",
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\nisolation = "isolated"\n'
    )
    ran = stella_main(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr

    indexes = set()
    for task in ("a", "b"):
        assert (marks / f"{task}.env").read_text() == "API_URL=http://localhost\n"
        index = (marks / f"{task}.index").read_text()
        assert (marks / f"{task}.setup").read_text() == f"installed for {task} on {index}\n"
        indexes.add(index)
    assert indexes == {"1", "2"}  # unique among the run's live worktrees
    record = run_record(git_repo)
    attempts = by_id(record["attempts"], "task_id")
    for task in ("a", "b"):
        assert attempts[task]["setup_ms"] is not None and attempts[task]["setup_ms"] >= 0
        log = Path(attempts[task]["log_path"]).read_text()
        assert f"[stella] setup: {setup}" in log and f"installed for {task}" in log
        assert "[stella] .worktreeinclude: copied 1 files" in log
    shown = stella_main("runs", record["run"]["id"], cwd=git_repo)
    assert "  setup " in shown.stdout and " s" in shown.stdout, shown.stdout
    # the copy and setup's output are ignored: the worktree is clean, and clean removes it
    worktree = Path(attempts["a"]["worktree"])
    assert git("status", "--porcelain", cwd=worktree) == ""


def test_a_failing_setup_fails_the_attempt_with_the_reason_and_starts_no_worker(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(
        git_repo,
        run=f"touch {marks}/worker-started",
        extra='[worktree]\nsetup = "echo cannot install >&2; exit 2"\n',
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n\n'
        '[[tasks]]\nid = "after"\nprompt = "p"\ndepends_on = ["a"]\n'
    )
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 1, ran.stdout + ran.stderr

    assert not (marks / "worker-started").exists()
    record = run_record(git_repo)
    tasks, attempts = by_id(record["tasks"]), by_id(record["attempts"], "task_id")
    reason = tasks["a"]["reason"]
    assert reason.startswith("setup failed: exit 2 after ") and reason.endswith(" s; see the log"), reason
    assert attempts["a"]["outcome"] == "failed" and attempts["a"]["pid"] is None
    assert attempts["a"]["setup_ms"] is not None
    assert "cannot install" in Path(attempts["a"]["log_path"]).read_text()
    assert tasks["after"]["status"] == "skipped" and tasks["after"]["reason"] == "dependency failed: a"


def test_a_setup_past_its_timeout_fails_the_attempt(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="true", extra='[worktree]\nsetup = "sleep 30"\nsetup_timeout = 0.5\n')
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    [task] = run_record(git_repo)["tasks"]
    assert task["reason"].startswith("setup failed: timed out after "), task["reason"]
    assert "(limit 0.5 s); see the log" in task["reason"]


def test_an_included_file_over_the_limit_fails_the_attempt_by_name(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    _repo_with_env(git_repo)
    (git_repo / ".env").write_bytes(b"x" * 2_000_000)
    write_config(git_repo, run="true", extra="[worktree]\ninclude_max_mb = 1\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    [task] = run_record(git_repo)["tasks"]
    assert task["reason"] == (
        "setup failed: .worktreeinclude: .env (2.0 MB) over [worktree] include_max_mb = 1: "
        "raise include_max_mb, or leave the file out of .worktreeinclude"
    )
    assert not any(StatePaths(git_repo).worktrees.glob("*/.env"))


def test_a_dry_run_names_the_setup_its_timeout_and_what_worktreeinclude_copies(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    _repo_with_env(git_repo)
    write_config(git_repo, run="true", extra='[worktree]\nsetup = "make -j2"\nsetup_timeout = 900\n')
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n')
    dry = stella_main("fleet", "--dry-run", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = "each new worktree: .worktreeinclude copies 1 file (0.0 MB); setup `make -j2` (timeout 900 s)"
    assert said in dry.stdout, dry.stdout
    doc = json.loads(
        stella_main(
            "fleet", "--dry-run", "--json", "--plan", str(plan), "--pipeline", "command", cwd=git_repo
        ).stdout
    )
    assert doc["worktree"] == {
        "setup": "make -j2", "setup_timeout": 900, "include_files": 1, "include_bytes": len("API_URL=http://localhost\n")
    }  # fmt: skip


# About 0.6 s of CPU (the worker alone takes about 0.15 s) in a grandchild of the setup's shell: the
# wrapper's wait4 must count it.
BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


@pytest.mark.parametrize("then", ["true", "exit 3"])
def test_the_setups_cpu_counts_in_the_attempts_cpu_and_its_start_is_recorded(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner, then: str
) -> None:
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    setup = f"sh -c {json.dumps(f'{sys.executable} {burn}')}; {then}"  # it succeeds, or fails after burning
    # the worker burns next to nothing: what the attempt counts beyond that is the setup's
    write_config(git_repo, run="true", extra=f"[worktree]\nsetup = {json.dumps(setup)}\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == (0 if then == "true" else 1), ran.stdout + ran.stderr
    attempt = run_record(git_repo)["attempts"][0]
    assert attempt["cpu_seconds"] >= 0.6, attempt
    started = attempt["setup_started_ms"]  # the dashboard's setup phase runs from it to setup_ms
    assert started is not None and started >= attempt["started_at_ms"], attempt
