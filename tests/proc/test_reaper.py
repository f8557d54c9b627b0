"""The reaper sidecar: once the process that started a worker dies, the worker's whole tree goes too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.fleet import wait_for

# A parent that starts a worker tree in a session of its own, as a Ray worker does: the reaper first,
# detached, watching a directory where the worker's tree is then named by a pid file (with its scratch
# directory). The worker's command runs in yet another session, as the command pipeline starts it, and a
# second one leaves it at once (a shell that exits under its sleep): only the attempt's identity in its
# environment names that orphan.
PARENT = """\
import os, subprocess, sys, time
marks = sys.argv[1]
kept, scratch = marks + "/kept", marks + "/scratch"
os.mkdir(kept)
os.mkdir(scratch)

def mark(name, text):  # whole or not at all: the test reads it as soon as it is there
    open(marks + "/" + name + ".tmp", "w").write(text)
    os.replace(marks + "/" + name + ".tmp", marks + "/" + name)

argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid()), kept, "1"]
reaper = int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
inner = "import os, subprocess, sys, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
inner += f"open({marks!r} + '/command.tmp', 'w').write(str(p.pid)); "
inner += f"os.replace({marks!r} + '/command.tmp', {marks!r} + '/command'); "
orphan = f"sleep 300 & echo $! > {marks}/o.tmp && mv {marks}/o.tmp {marks}/orphan"
inner += f"subprocess.run(['sh', '-c', {orphan!r}]); "
inner += "time.sleep(300)"
ids = {"STELLA_ROOT": marks, "STELLA_RUN_ID": "r-1", "STELLA_ATTEMPT_ID": "1"}
worker = subprocess.Popen([sys.executable, "-c", inner], start_new_session=True, env={**os.environ, **ids})
open(kept + "/attempt-1.tmp", "w").write(f"{worker.pid}\\n{scratch}\\n")
os.replace(kept + "/attempt-1.tmp", kept + "/attempt-1.pid")
mark("worker", str(worker.pid))
mark("reaper", str(reaper))
time.sleep(300)
"""
NAMES = ("worker", "command", "orphan", "reaper")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone_within(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_dead_parent_takes_its_workers_tree_along(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)])
    try:
        for name in NAMES:
            wait_for(tmp_path / name, timeout=30, process=parent)
        pids = [int((tmp_path / name).read_text()) for name in NAMES]
        assert all(alive(pid) for pid in pids)
        assert psutil.Process(pids[2]).ppid() != pids[0]  # the orphan has left the worker's tree
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone_within(pids, 15), [pid for pid in pids if alive(pid)]
        assert not (tmp_path / "scratch").exists()  # the attempt's scratch directory went with it
        assert not (tmp_path / "kept").exists()
    finally:
        for name in NAMES:
            path = tmp_path / name
            if path.exists() and alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def test_it_refuses_a_tree_that_holds_itself_or_the_whole_system() -> None:
    from stellafleet.proc.reaper import check_root

    for pid in (1, os.getpid(), os.getppid()):
        with pytest.raises(ValueError, match="refusing"):
            check_root(pid)


def test_the_reaper_ends_by_itself_once_its_process_has_with_nothing_to_stop(tmp_path: Path) -> None:
    watched = subprocess.Popen(["sleep", "0.5"])
    kept = tmp_path / "kept"
    kept.mkdir()
    argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(watched.pid), str(kept), "1"]
    reaper = int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    watched.wait()
    assert gone_within([reaper], 15)
    assert not kept.exists()


def test_it_refuses_a_directory_that_is_not_there(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid())]
    done = subprocess.run([*argv, str(tmp_path / "x"), "1"], capture_output=True, text=True)
    assert done.returncode == 2 and "not a directory" in done.stderr


# A parent that runs attempts one after another, as a Ray worker does: one kept reaper watches a directory,
# each worker tree is named there by a pid file while it runs. Worker "done" had its file removed (its
# attempt is over), worker "running" still has its file when the parent dies.
KEPT = """\
import os, subprocess, sys, tempfile, time
marks = sys.argv[1]
kept = marks + "/kept"
os.mkdir(kept)
argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid()), kept, "1"]
reaper = int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
def mark(name, text):  # whole or not at all: the test reads a mark as soon as it appears
    open(marks + "/" + name + ".tmp", "w").write(text)
    os.replace(marks + "/" + name + ".tmp", marks + "/" + name)
for name in ("done", "running"):
    os.mkdir(marks + "/scratch-" + name)
    worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
    open(kept + "/" + name + ".tmp", "w").write(f"{worker.pid}\\n{marks}/scratch-{name}\\n")
    os.replace(kept + "/" + name + ".tmp", kept + "/" + name + ".pid")
    mark(name, str(worker.pid))
time.sleep(1.0)  # the reaper has learned both trees
os.unlink(kept + "/done.pid")
time.sleep(1.0)  # and forgotten the one whose file went
mark("reaper", str(reaper))
time.sleep(300)
"""


def test_a_kept_reaper_stops_the_trees_still_named_and_forgets_the_ended_ones(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", KEPT, str(tmp_path)])
    pids: dict[str, int] = {}
    try:
        for name in ("done", "running", "reaper"):
            wait_for(tmp_path / name, timeout=30, process=parent)
            pids[name] = int((tmp_path / name).read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone_within([pids["running"], pids["reaper"]], 15)
        assert alive(pids["done"])  # its attempt was over: not the reaper's to stop
        assert not (tmp_path / "kept").exists() and not (tmp_path / "scratch-running").exists()
        assert (tmp_path / "scratch-done").exists()
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
