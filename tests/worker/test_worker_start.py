"""A worker started as the fleet starts it: a fresh `python -P -m stellafleet.worker.main` in its own
session, its command its child, its environment exactly the one it is handed, ending with a killed fleet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from helpers.fleet import (
    by_id,
    file_locks,
    make_attempt,
    run_record,
    wait_exit,
    wait_for,
    wait_until,
    write_config,
)

from stellafleet.proc.tree import ProcessTree
from stellafleet.run.executor import WORKER_ARGV


def _spawn(tmp_path: Path, env: dict[str, str], log_path: Path) -> ProcessTree:
    return ProcessTree.spawn(WORKER_ARGV, cwd=tmp_path, env=env, log_path=log_path)


def test_a_worker_gets_exactly_its_environment_cwd_session_and_log_and_runs_its_command_as_its_child(
    tmp_path: Path, isolated_home: Path
) -> None:
    ctx = make_attempt(tmp_path)
    write_config(
        tmp_path,
        run='echo $PPID > ppid.txt; echo "cwd=$(pwd) prompt=$STELLA_PROMPT leaked=${LEAKED:-no}"; '
        "env | sort > env.txt",
    )
    os.environ["LEAKED"] = "yes"  # in the test process only: the worker gets the env it is handed
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(isolated_home), **ctx.to_env()}
        tree = _spawn(tmp_path, env, ctx.log_path)
    finally:
        del os.environ["LEAKED"]
    assert os.getsid(tree.pid) == tree.pid  # its own session, led by itself
    assert psutil.Process(tree.pid).ppid() == os.getpid()  # a plain child of whoever started it
    done = wait_exit(tree)
    assert done.returncode == 0 and done.describe() == "exit status 0"
    assert done.cpu_seconds > 0 and done.peak_rss_bytes > 1_000_000
    assert int((tmp_path / "ppid.txt").read_text()) == tree.pid  # the command is the worker's child
    result = json.loads(ctx.result_path.read_text())
    assert result["summary"] == f"cwd={tmp_path} prompt=do the thing leaked=no"
    names = {line.split("=", 1)[0] for line in (tmp_path / "env.txt").read_text().splitlines()}
    assert "LEAKED" not in names and "STELLA_TASK_ID" in names
    assert "stella worker: succeeded" in ctx.log_path.read_text()


def test_a_worker_killed_by_a_signal_reports_it(tmp_path: Path, isolated_home: Path) -> None:
    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="touch started; exec sleep 300")
    tree = _spawn(tmp_path, {"PATH": os.environ["PATH"], **ctx.to_env()}, ctx.log_path)
    wait_for(tmp_path / "started", timeout=30, process=tree)  # its command is running: a whole tree to kill
    tree.sample()
    tree.signal_tree(signal.SIGKILL)
    assert wait_exit(tree).describe() == "killed by signal SIGKILL"


# Plays a fleet: starts the worker as the executor does (its own session), says its pid, then waits to be
# killed. The worker's command says it has started its own child.
FLEET = """\
import os, subprocess, sys, time
worker = subprocess.Popen(sys.argv[1:], env=os.environ, start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(worker.pid, flush=True)
time.sleep(300)
"""


def test_a_worker_whose_fleet_dies_ends_itself_and_its_whole_group(
    tmp_path: Path, isolated_home: Path
) -> None:
    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="sleep 300 & echo $! > child.txt; wait")
    env = {**os.environ, **ctx.to_env()}
    fleet = subprocess.Popen(
        [sys.executable, "-c", FLEET, *WORKER_ARGV], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert fleet.stdout is not None
        worker = int(fleet.stdout.readline())
        child_file = tmp_path / "child.txt"
        wait_until(lambda: child_file.exists() and child_file.read_text().endswith("\n"), "the child's pid",
                   process=fleet, timeout=30)  # fmt: skip
        child = int((tmp_path / "child.txt").read_text())
        assert os.getpgid(child) == worker  # the command's child is in the worker's group
        fleet.kill()
        fleet.wait()
        # orphaned, the worker ends itself and its whole group (proc/subreaper.py)
        wait_until(lambda: not _running(worker) and not _running(child), "the worker and its child to end",
                   timeout=10)  # fmt: skip
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_each_worker_reads_the_config_as_it_is_when_it_starts(tmp_path: Path, isolated_home: Path) -> None:
    def run_one(task_id: str) -> dict[str, object]:
        ctx = make_attempt(tmp_path, task_id)
        env = {"PATH": os.environ["PATH"], "HOME": str(isolated_home), **ctx.to_env()}
        assert wait_exit(_spawn(tmp_path, env, ctx.log_path)).returncode in (0, 1)
        result: dict[str, object] = json.loads(ctx.result_path.read_text())
        return result

    write_config(tmp_path, run="echo first")
    assert run_one("t1")["summary"] == "first"
    write_config(tmp_path, run="echo again")  # same size: only the file's times and identity differ
    assert run_one("t2")["summary"] == "again"
    (tmp_path / ".stella" / "config.toml").write_text("[pipelines.command\n")
    broken = run_one("t3")
    assert broken["success"] is False and "invalid TOML" in str(broken["error"])


def test_a_fleet_runs_its_workers_and_ignores_modules_in_the_repository(
    git_repo: Path, isolated_home: Path
) -> None:
    # A repository file named like a module the worker imports must never be picked up.
    (git_repo / "json.py").write_text("raise SystemExit('the repository shadowed json')\n")
    (git_repo / "stellafleet").mkdir()
    (git_repo / "stellafleet" / "__init__.py").write_text(
        "raise SystemExit('the repository shadowed stella')\n"
    )
    write_config(git_repo, run='echo "ok from $STELLA_TASK_ID"', tasks={"t2": "kill -9 $PPID"})
    # the installed `stella` script (`python -m` would put the repository on the fleet's own sys.path)
    script = str(Path(sys.executable).parent / "stella")
    args = [script, "fleet", "--pipeline", "command", "--max-concurrency", "3", "a", "b", "c"]
    proc = subprocess.run(args, cwd=git_repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert tasks["t1"]["status"] == tasks["t3"]["status"] == "succeeded"
    assert by_id(record["attempts"], key="task_id")["t1"]["summary"] == "ok from t1"
    assert tasks["t2"]["reason"] == "worker killed by signal SIGKILL"
    assert file_locks(git_repo) == []
