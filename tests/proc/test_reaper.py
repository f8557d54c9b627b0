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

# A parent that starts a worker tree in a session of its own (the worker's command in yet another
# session, as the command pipeline starts it) and the reaper, detached, then waits to be killed.
PARENT = """\
import os, subprocess, sys, time
marks = sys.argv[1]
inner = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
inner += f"open({marks!r} + '/command', 'w').write(str(p.pid)); time.sleep(300)"
os.mkdir(marks + "/scratch")
root_file = marks + "/scratch/root.pid"  # the reaper starts first and learns the worker's pid from this file
argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid()), root_file, "1"]
reaper = int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
worker = subprocess.Popen([sys.executable, "-c", inner], start_new_session=True)
open(root_file + ".tmp", "w").write(str(worker.pid))
os.replace(root_file + ".tmp", root_file)
open(marks + "/worker", "w").write(str(worker.pid))
open(marks + "/reaper", "w").write(str(reaper))
time.sleep(300)
"""


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
        for name in ("worker", "reaper", "command"):
            wait_for(tmp_path / name, timeout=30, process=parent)
        pids = [int((tmp_path / name).read_text()) for name in ("worker", "command", "reaper")]
        assert all(alive(pid) for pid in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone_within(pids, 15), [pid for pid in pids if alive(pid)]
        assert not (tmp_path / "scratch").exists()  # the attempt's scratch directory went with it
    finally:
        for name in ("worker", "command", "reaper"):
            path = tmp_path / name
            if path.exists() and alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def test_it_refuses_a_tree_that_holds_itself_or_the_whole_system() -> None:
    from stellafleet.proc.reaper import check_root

    for pid in (1, os.getpid(), os.getppid()):
        with pytest.raises(ValueError, match="refusing"):
            check_root(pid)


def test_the_reaper_ends_by_itself_with_the_tree(tmp_path: Path) -> None:
    worker = subprocess.Popen(["sleep", "0.5"], start_new_session=True)
    argv = [sys.executable, "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid()), str(worker.pid)]
    reaper = int(subprocess.run([*argv, "1"], capture_output=True, text=True, check=True).stdout)
    worker.wait()
    assert gone_within([reaper], 15)


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
for name in ("done", "running"):
    os.mkdir(marks + "/scratch-" + name)
    worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
    open(kept + "/" + name + ".tmp", "w").write(f"{worker.pid}\\n{marks}/scratch-{name}\\n")
    os.replace(kept + "/" + name + ".tmp", kept + "/" + name + ".pid")
    open(marks + "/" + name, "w").write(str(worker.pid))
time.sleep(1.0)  # the reaper has learned both trees
os.unlink(kept + "/done.pid")
time.sleep(1.0)  # and forgotten the one whose file went
open(marks + "/reaper", "w").write(str(reaper))
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
