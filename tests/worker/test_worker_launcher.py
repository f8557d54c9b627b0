"""The warm launcher that forks workers: a forked worker is a worker like an exec'd one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers.fleet import by_id, file_locks, make_attempt, run_record, wait_exit, write_config

from stellafleet.proc.tree import UNKNOWN_STATUS, ProcessTree
from stellafleet.worker.launcher import Launcher, LauncherGone


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    started = Launcher.start(["stellafleet.pipelines.command"], cwd=tmp_path)
    assert started is not None  # Linux with pidfd: the fleet's default
    yield started
    started.close()


def test_a_forked_worker_gets_exactly_its_environment_cwd_session_and_log(
    tmp_path: Path, isolated_home: Path, launcher: Launcher
) -> None:
    ctx = make_attempt(tmp_path)
    write_config(
        tmp_path, run='echo "cwd=$(pwd) prompt=$STELLA_PROMPT leaked=${LEAKED:-no}"; env | sort > env.txt'
    )
    os.environ["LEAKED"] = "yes"  # in the test process only: the worker gets the env it is handed
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(isolated_home), **ctx.to_env()}
        tree = ProcessTree.spawn([], cwd=tmp_path, env=env, log_path=ctx.log_path, launcher=launcher)
    finally:
        del os.environ["LEAKED"]
    assert os.getsid(tree.pid) == tree.pid  # its own session, led by itself
    assert psutil.Process(tree.pid).ppid() != os.getpid()  # the launcher's child, not ours
    done = wait_exit(tree)
    assert done.returncode == 0 and done.describe() == "exit status 0"
    assert done.cpu_seconds > 0 and done.peak_rss_bytes > 1_000_000
    result = json.loads(ctx.result_path.read_text())
    assert result["summary"] == f"cwd={tmp_path} prompt=do the thing leaked=no"
    names = {line.split("=", 1)[0] for line in (tmp_path / "env.txt").read_text().splitlines()}
    assert "LEAKED" not in names and "STELLA_TASK_ID" in names
    assert "stella worker: succeeded" in ctx.log_path.read_text()


def test_a_forked_worker_killed_by_a_signal_reports_it(
    tmp_path: Path, isolated_home: Path, launcher: Launcher
) -> None:
    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="sleep 300")
    env = {"PATH": os.environ["PATH"], **ctx.to_env()}
    tree = ProcessTree.spawn([], cwd=tmp_path, env=env, log_path=ctx.log_path, launcher=launcher)
    time.sleep(0.2)
    tree.sample()
    tree.signal_tree(signal.SIGKILL)
    assert wait_exit(tree).describe() == "killed by signal SIGKILL"


def test_when_the_launcher_is_gone_spawning_says_so_and_its_workers_end_with_everything_they_started(
    tmp_path: Path, isolated_home: Path, launcher: Launcher
) -> None:
    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="while true; do sleep 0.02; done")
    env = {"PATH": os.environ["PATH"], **ctx.to_env()}
    tree = ProcessTree.spawn([], cwd=tmp_path, env=env, log_path=ctx.log_path, launcher=launcher)
    deadline = time.monotonic() + 10
    while not [p for p in psutil.process_iter() if _group_of(p) == tree.pid and p.pid != tree.pid]:
        assert time.monotonic() < deadline, "the worker never started its command"
        time.sleep(0.01)
    launcher._proc.kill()  # the launcher dies under a running worker
    launcher._proc.wait()
    deadline = time.monotonic() + 10
    while launcher.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(LauncherGone):
        launcher.spawn(env=env, cwd=tmp_path, log_path=ctx.log_path)
    # orphaned, the worker ends itself and its whole group (proc/orphan.py); nobody is left to tell how
    assert wait_exit(tree).returncode == UNKNOWN_STATUS
    deadline = time.monotonic() + 10
    while [p for p in psutil.process_iter() if _group_of(p) == tree.pid]:
        assert time.monotonic() < deadline, "a process the orphaned worker started still runs"
        time.sleep(0.01)


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


@pytest.mark.parametrize("fork", [True, False])
def test_both_ways_of_starting_workers_run_a_fleet_and_ignore_modules_in_the_repository(
    git_repo: Path, isolated_home: Path, fork: bool
) -> None:
    # A repository file named like a module the worker imports must never be picked up.
    (git_repo / "json.py").write_text("raise SystemExit('the repository shadowed json')\n")
    (git_repo / "stellafleet").mkdir()
    (git_repo / "stellafleet" / "__init__.py").write_text(
        "raise SystemExit('the repository shadowed stella')\n"
    )
    write_config(
        git_repo,
        run='echo "ok from $STELLA_TASK_ID"',
        tasks={"t2": "kill -9 $PPID"},
        extra=f"[fleet]\nfork_workers = {str(fork).lower()}\n",
        direct=False,  # the workers are what this is about
    )
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
    launchers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "stellafleet.worker.launcher" in (p.info["cmdline"] or [])
    ]
    assert not [p for p in launchers if str(git_repo) in " ".join(p.cwd() for _ in [0])]


def test_a_preloaded_module_that_starts_a_thread_makes_the_fleet_fall_back_to_fresh_interpreters(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "threaded_pipeline.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "from stellafleet.pipelines.command import CommandPipeline as Threaded\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(plugins))
    launcher = Launcher.start(["threaded_pipeline"], cwd=tmp_path)
    assert launcher is not None
    ctx = make_attempt(tmp_path)
    with pytest.raises(LauncherGone):
        launcher.spawn(env=ctx.to_env(), cwd=tmp_path, log_path=ctx.log_path)
    launcher.close()


def test_the_executor_starts_fresh_interpreters_once_its_launcher_is_gone(
    tmp_path: Path, isolated_home: Path, launcher: Launcher
) -> None:
    from stellafleet.run.executor import LocalExecutor

    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="echo fresh")
    launcher._proc.kill()
    launcher._proc.wait()
    executor = LocalExecutor(launcher=launcher)
    deadline = time.monotonic() + 10
    while launcher.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    tree = executor._spawn(tmp_path, {**os.environ, **ctx.to_env()}, ctx.log_path)
    assert tree.popen is not None and executor.launcher is None
    assert wait_exit(tree).returncode == 0
    assert json.loads(ctx.result_path.read_text())["summary"] == "fresh"


def test_a_forked_worker_gets_its_environment_as_sent_whatever_the_launcher_started_with(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DROPPED", "the launcher has it")
    monkeypatch.setenv("CHANGED", "old")
    started = Launcher.start(["stellafleet.pipelines.command"], cwd=tmp_path)
    assert started is not None
    try:
        ctx = make_attempt(tmp_path)
        write_config(tmp_path, run="env | sort > env.txt")
        env = {k: v for k, v in os.environ.items() if k != "DROPPED"}
        env.update(CHANGED="new", ADDED="yes", **ctx.to_env())
        tree = ProcessTree.spawn([], cwd=tmp_path, env=env, log_path=ctx.log_path, launcher=started)
        assert wait_exit(tree).returncode == 0
    finally:
        started.close()
    seen = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines() if "=" in line)
    assert "DROPPED" not in seen
    assert seen["CHANGED"] == "new" and seen["ADDED"] == "yes" and seen["STELLA_TASK_ID"] == "t1"


def test_forked_workers_see_config_changes_between_them(
    tmp_path: Path, isolated_home: Path, launcher: Launcher
) -> None:
    """The launcher loads the config once for its workers, but never hands one a stale copy."""

    def run_one(task_id: str, **extra: str) -> dict[str, object]:
        ctx = make_attempt(tmp_path, task_id)
        env = {"PATH": os.environ["PATH"], "HOME": str(isolated_home), **ctx.to_env(), **extra}
        tree = ProcessTree.spawn([], cwd=tmp_path, env=env, log_path=ctx.log_path, launcher=launcher)
        assert wait_exit(tree).returncode in (0, 1)
        result: dict[str, object] = json.loads(ctx.result_path.read_text())
        return result

    write_config(tmp_path, run="echo first")
    assert run_one("t1")["summary"] == "first"
    assert run_one("t2")["summary"] == "first"  # unchanged: the preloaded copy
    write_config(tmp_path, run="echo again")  # same size: only the file's times and identity differ
    assert run_one("t3")["summary"] == "again"
    # the user's own config layer, chosen by the worker's environment
    (tmp_path / "project.toml").write_text("")
    other = tmp_path / "other-home"
    (other / "stella").mkdir(parents=True)
    (other / "stella" / "config.toml").write_text('[pipelines.command]\nrun = "echo user layer"\n')
    project = {"STELLA_CONFIG": str(tmp_path / "project.toml")}
    assert run_one("t4", XDG_CONFIG_HOME=str(other), **project)["summary"] == "user layer"
    (tmp_path / "project.toml").write_text("[pipelines.command]\nrun = 'echo project layer'\n")
    assert run_one("t5", XDG_CONFIG_HOME=str(other), **project)["summary"] == "project layer"
    (tmp_path / "project.toml").write_text("[pipelines.command\n")
    broken = run_one("t6", XDG_CONFIG_HOME=str(other), **project)
    assert broken["success"] is False and "invalid TOML" in str(broken["error"])


def test_a_worker_forked_right_after_preload_config_uses_that_config_without_reading_it(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stellafleet.worker import main as worker

    ctx = make_attempt(tmp_path)
    write_config(tmp_path, run="echo preloaded")
    env = {**os.environ, **ctx.to_env()}
    monkeypatch.setattr(worker, "_preloaded", None)  # so the test process is back to none afterwards
    monkeypatch.setattr(worker, "_preloaded_for", None)
    worker.preload_config(env)  # what the launcher does just before it forks
    write_config(tmp_path, run="echo read again")
    spend = worker.LedgerSpend(ctx)
    try:
        assert worker.run_task(ctx, spend).summary == "preloaded"
    finally:
        spend.close()
    worker.preload_config(env)  # the launcher's next fork sees the change
    spend = worker.LedgerSpend(ctx)
    try:
        assert worker.run_task(ctx, spend).summary == "read again"
    finally:
        spend.close()


def test_the_early_launcher_is_gone_when_a_later_check_refuses_the_run(
    git_repo: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stellafleet.core.errors import StellaError
    from stellafleet.core.paths import StatePaths
    from stellafleet.run.control import run_fleet
    from stellafleet.run.prepare import FleetOptions

    write_config(git_repo, run="true")
    monkeypatch.setenv("PATH", os.pathsep.join([str(isolated_home / "no-gh"), os.environ["PATH"]]))
    (isolated_home / "no-gh").mkdir()
    (isolated_home / "no-gh" / "gh").write_text("#!/bin/sh\necho 'not logged in' >&2\nexit 1\n")
    (isolated_home / "no-gh" / "gh").chmod(0o755)
    options = FleetOptions(prompts=["a"], pipeline="command", watch=True, cwd=git_repo)
    with pytest.raises(StellaError, match="gh"):  # refused after the launcher has started
        run_fleet(options)
    launchers = [
        child
        for child in psutil.Process().children(recursive=True)
        if "stellafleet.worker.launcher" in " ".join(child.cmdline())
    ]
    assert launchers == []
    write_config(git_repo, run="true", extra='[fleet]\nfork_workers = "yes"\n')
    with pytest.raises(StellaError, match="fork_workers must be true or false"):
        run_fleet(FleetOptions(prompts=["a"], pipeline="command", cwd=git_repo))
    assert not StatePaths(git_repo).fleet_db.exists()  # refused before anything was written
