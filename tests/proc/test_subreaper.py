"""Nothing outlives its attempt, not even a double-forked child (fork, setsid, fork, the middle one exits:
it leaves the worker's process group and tree): the worker is a child subreaper, so the orphan stays its
descendant and is ended with the attempt; the same for what the `[notify] command` leaves running."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers.fleet import by_id, run_record, write_config
from helpers.merging import build_run
from helpers.repo import StellaRunner
from helpers.spawn import ended_within

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's")

# argv: PIDFILE TARGET. The grandchild, in a session of its own, rewrites TARGET every 20 ms forever.
DOUBLE_FORK = """\
import os, sys, time
pidfile, target = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        n = 0
        while True:
            n += 1
            with open(target, "w") as out:
                out.write(str(n))
            if n == 1:
                with open(pidfile + ".tmp", "w") as out:
                    out.write(str(os.getpid()))
                os.replace(pidfile + ".tmp", pidfile)
            time.sleep(0.02)
    os._exit(0)
os.wait()
while not os.path.exists(pidfile):
    time.sleep(0.01)
"""


@pytest.fixture(autouse=True)
def no_writer_left(tmp_path: Path) -> Iterator[None]:
    """Whatever a failing test leaves running is killed (each writer runs the script under tmp_path)."""
    yield
    script = str(tmp_path / "double_fork.py")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if script in (proc.info["cmdline"] or []):
            os.kill(proc.info["pid"], signal.SIGKILL)


def double_fork(tmp_path: Path, pidfile: Path, target: Path) -> str:
    script = tmp_path / "double_fork.py"
    script.write_text(DOUBLE_FORK)
    return shlex.join([sys.executable, str(script), str(pidfile), str(target)])


def assert_gone_and_quiet(pidfile: Path, target: Path) -> None:
    pid = int(pidfile.read_text())
    assert ended_within(pid, 5), f"the double-forked writer {pid} outlived its attempt"
    written = target.read_text()
    time.sleep(0.3)
    assert target.read_text() == written  # nobody writes the tree any more


def test_a_double_forked_child_writing_the_shared_tree_ends_with_its_attempt(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    pidfile, target = tmp_path / "writer.pid", git_repo / "written.txt"
    write_config(git_repo, run=double_fork(tmp_path, pidfile, target))

    proc = stella("fleet", "--pipeline", "command", "leave a writer behind", cwd=git_repo)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert by_id(run_record(git_repo)["tasks"])["t1"]["status"] == "succeeded"
    assert_gone_and_quiet(pidfile, target)
    log = Path(run_record(git_repo)["attempts"][0]["log_path"]).read_text()
    assert "ended 1 process(es) the task left running" in log


def test_a_double_forked_child_of_the_notify_command_ends_with_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    pidfile, target = tmp_path / "writer.pid", tmp_path / "notified.txt"
    notify = f"[notify]\ncommand = {json.dumps(double_fork(tmp_path, pidfile, target))}\ntimeout = 30\n"
    write_config(git_repo, run="exit 3", extra=notify)

    proc = stella("fleet", "--pipeline", "command", "fail, so the notify command runs", cwd=git_repo)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_gone_and_quiet(pidfile, target)


def test_a_double_forked_child_of_a_timed_out_attempt_ends_with_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    pidfile, target = tmp_path / "writer.pid", git_repo / "written.txt"
    write_config(git_repo, run=double_fork(tmp_path, pidfile, target) + "; sleep 60")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "slow"\nprompt = "p"\ntimeout = 2\n')

    proc = stella("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert by_id(run_record(git_repo)["tasks"])["slow"]["status"] == "failed"
    assert_gone_and_quiet(pidfile, target)


def test_a_double_forked_child_of_the_merge_check_ends_with_the_check(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    build_run(git_repo)
    pidfile, target = tmp_path / "writer.pid", tmp_path / "checked.txt"
    proc = stella("merge", "--check", double_fork(tmp_path, pidfile, target), cwd=git_repo)
    assert "merged" in proc.stdout, proc.stdout + proc.stderr
    assert_gone_and_quiet(pidfile, target)


def test_a_double_forked_child_of_a_killed_worker_ends_with_its_attempt(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    """The worker is SIGKILLed a moment after the double fork, well before the fleet's next sample of its
    tree: the orphan is handed to init, out of every tree, and is found by the attempt's environment."""
    pidfile, target = tmp_path / "writer.pid", git_repo / "written.txt"
    kill_worker = (
        "import os, psutil, signal, sys; orphan = psutil.Process(int(open(sys.argv[1]).read())); "
        "os.kill(orphan.ppid(), signal.SIGKILL)"  # the worker: the subreaper the orphan was handed to
    )
    killer = shlex.join([sys.executable, "-c", kill_worker, str(pidfile)])
    run = f"{double_fork(tmp_path, pidfile, target)} && {killer}"
    write_config(git_repo, run=run)

    proc = stella("fleet", "--pipeline", "command", "leave a writer, then lose the worker", cwd=git_repo)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert by_id(run_record(git_repo)["tasks"])["t1"]["status"] == "failed"
    assert_gone_and_quiet(pidfile, target)


def test_an_attempts_identity_names_its_repository_too(tmp_path: Path) -> None:
    """Run and attempt ids are per ledger: another repository's attempt with the same ids (two fleets side
    by side, each with its attempt 1) is not this one's, and its processes are left alone."""
    from stellafleet.proc.group import carrying

    ids = {"STELLA_RUN_ID": "r-1", "STELLA_ATTEMPT_ID": "1"}
    theirs = {**os.environ, **ids, "STELLA_ROOT": str(tmp_path / "theirs")}
    with subprocess.Popen(["sleep", "30"], env=theirs) as other:
        try:
            mine = {**ids, "STELLA_ROOT": str(tmp_path / "mine")}
            assert other.pid not in {proc.pid for proc in carrying(mine)}
            assert other.pid in {proc.pid for proc in carrying({**ids, "STELLA_ROOT": theirs["STELLA_ROOT"]})}
        finally:
            other.kill()
