"""A `stella merge --resolve` killed together with its resolve worker is finished by the next stella
command, as a killed plain merge is: the resolve task's process group is stopped, its uncommitted work
salvaged, its attempt `abandoned` and its task `interrupted`, its worktree and empty branch removed, and
the conflicting branch's `planned` row settled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
from helpers.fleet import Scripts, write_config
from helpers.merging import RUN_ID, build_run, merges
from helpers.repo import StellaRunner, git
from helpers.spawn import ended_within
from merge.test_merge_killed import kill_merge, start_merge, wait_for, worktrees

from stellafleet.core.paths import StatePaths
from stellafleet.proc.group import group_exists
from stellafleet.state.ledger import Ledger

# The resolver starts a helper of its own (as an agent CLI would), leaves a file uncommitted, says who
# they are, and works on for longer than the test waits.
STUCK = """
helper = subprocess.Popen(["sleep", "300"])
(WS / "half-done.txt").write_text("resolving\\n")
Path(os.environ["MARKS"], "resolver.json.tmp").write_text(json.dumps([os.getpid(), helper.pid]))
os.replace(Path(os.environ["MARKS"], "resolver.json.tmp"), Path(os.environ["MARKS"], "resolver.json"))
time.sleep(300)
"""


def start_stuck_resolve(root: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], int, int]:
    """`stella merge --resolve` started, once its resolver runs: the merge, the resolver and its helper."""
    write_config(root, run=Scripts(tmp_path / "scripts").python("resolver", STUCK))
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start_merge(root, {"MARKS": str(marks)}, "--resolve")  # --serial: start_merge
    wait_for(marks / "resolver.json", proc=proc)
    resolver, helper = json.loads((marks / "resolver.json").read_text())
    return proc, int(resolver), int(helper)


def test_a_merge_killed_with_its_resolve_worker_is_finished_by_the_next_command(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    start = git("rev-parse", "main", cwd=git_repo).strip()
    proc, resolver, helper = start_stuck_resolve(git_repo, tmp_path)
    worker = os.getpgid(resolver)  # the worker leads a session of its own: its group is its pid
    scratch = Path(json.loads(StatePaths(git_repo).merge_journal.read_text())["scratch"])
    # killed together: the merge with everything in its session, and the worker itself (SIGKILL, so it
    # cannot stop its group); the resolver and its helper live on in the worker's group
    kill_merge(proc)
    os.kill(worker, signal.SIGKILL)
    assert ended_within(worker, 10)
    assert psutil.pid_exists(resolver) and psutil.pid_exists(helper) and group_exists(worker)
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(RUN_ID)
    [task] = [t for t in record["tasks"] if t["id"] == "resolve-c"]
    [attempt] = [a for a in record["attempts"] if a["task_id"] == "resolve-c"]
    assert task["status"] == "running" and attempt["outcome"] == "running" and attempt["pid"] == worker
    resolve_tree, resolve_branch = Path(attempt["worktree"]), attempt["branch"]
    assert resolve_tree.is_dir() and str(resolve_tree) in worktrees(git_repo)

    done = stella("runs", cwd=git_repo)

    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "a killed stella merge" in line]
    assert len(said) == 1, done.stderr
    assert f"its resolve task resolve-c: its worker (pid {worker}) stopped" in said[0]
    assert "its worktree removed" in said[0] and f"its empty branch {resolve_branch} deleted" in said[0]
    assert ended_within(resolver, 10) and ended_within(helper, 10) and not group_exists(worker)
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(RUN_ID)
    [task] = [t for t in record["tasks"] if t["id"] == "resolve-c"]
    [attempt] = [a for a in record["attempts"] if a["task_id"] == "resolve-c"]
    assert task["status"] == "interrupted" and "killed while this resolve task ran" in task["reason"]
    assert attempt["outcome"] == "abandoned" and attempt["finished_at_ms"] is not None
    # what it left uncommitted is kept, as a killed fleet's attempts' work is
    assert git("show", f"{attempt['salvage_sha']}:half-done.txt", cwd=git_repo) == "resolving\n"
    assert not resolve_tree.exists() and not scratch.exists() and worktrees(git_repo) == [str(git_repo)]
    assert git("branch", "--list", resolve_branch, cwd=git_repo) == ""
    statuses = {r["task_id"]: r["status"] for r in merges(git_repo)}
    assert statuses == {"a": "merged", "b": "merged", "c": "error"}
    assert git("rev-parse", "main", cwd=git_repo).strip() != start  # a and b landed before c
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    assert not StatePaths(git_repo).merge_journal.exists()
    assert stella("runs", cwd=git_repo).stderr == ""  # nothing left for a later command


def test_a_merge_interrupted_with_ctrl_c_while_resolving_settles_its_resolve_task_at_once(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    proc, resolver, helper = start_stuck_resolve(git_repo, tmp_path)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, out + err
    assert ended_within(resolver, 10) and ended_within(helper, 10)
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(RUN_ID)
    [task] = [t for t in record["tasks"] if t["id"] == "resolve-c"]
    [attempt] = [a for a in record["attempts"] if a["task_id"] == "resolve-c"]
    assert task["status"] == "interrupted" and attempt["outcome"] == "interrupted"
    assert git("show", f"{attempt['salvage_sha']}:half-done.txt", cwd=git_repo) == "resolving\n"
    assert not Path(attempt["worktree"]).exists() and worktrees(git_repo) == [str(git_repo)]
    assert git("branch", "--list", attempt["branch"], cwd=git_repo) == ""
    assert {r["task_id"]: r["status"] for r in merges(git_repo)}["c"] == "error"
    assert not StatePaths(git_repo).merge_journal.exists()
    assert stella("runs", cwd=git_repo).stderr == ""  # nothing left for the next command
