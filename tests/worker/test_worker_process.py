"""Worker process trees: own session, exact exit status, measured CPU and memory, stopped as a whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.fleet import wait_exit, wait_for, wait_until

from stellafleet.proc.tree import ProcessTree, signal_description


def spawn(tmp_path: Path, code: str) -> ProcessTree:
    return ProcessTree.spawn(
        [sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "logs" / "w.log"
    )


def test_exit_status_output_and_session(tmp_path: Path) -> None:
    tree = spawn(tmp_path, "import os, sys; print('hello', os.getsid(0)); sys.exit(3)")
    assert os.getsid(tree.pid) != os.getsid(0)  # its own session: the terminal's Ctrl-C never reaches it
    done = wait_exit(tree)
    assert done.returncode == 3 and done.describe() == "exit status 3"
    assert (tmp_path / "logs" / "w.log").read_text().startswith("hello ")
    assert tree.poll() is done  # reaped once, remembered


def test_cpu_time_and_peak_memory_are_measured(tmp_path: Path) -> None:
    code = (
        "import time\nblob = bytearray(80 * 1024 * 1024)\nfor i in range(0, len(blob), 4096): blob[i] = 1\n"
        "print('touched', flush=True)\n"
        "end = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    )
    tree = spawn(tmp_path, code)
    log = tmp_path / "logs" / "w.log"
    wait_until(lambda: "touched" in log.read_text(), "the memory to be touched", process=tree)
    tree.sample()
    done = wait_exit(tree)
    assert done.cpu_seconds >= 0.35
    assert done.peak_rss_bytes >= 80 * 1024 * 1024


def test_signal_tree_reaches_grandchildren_even_in_another_session(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "a = subprocess.Popen(['sleep', '300'])\n"
        "b = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(a.pid, b.pid, flush=True)\ntime.sleep(300)\n"
    )
    tree = spawn(tmp_path, code)
    log = tmp_path / "logs" / "w.log"
    wait_until(lambda: log.read_text().endswith("\n"), "the grandchildren's pids", process=tree)
    grandchildren = [int(pid) for pid in log.read_text().split()]
    tree.sample()
    tree.signal_tree(signal.SIGKILL)
    done = wait_exit(tree)
    assert done.describe() == "killed by signal SIGKILL"
    for pid in grandchildren:
        wait_until(lambda pid=pid: _ended(pid), f"grandchild {pid} to end", timeout=10)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_signal_descriptions() -> None:
    assert signal_description(0) == "exit status 0"
    assert signal_description(-9) == "killed by signal SIGKILL"
    assert signal_description(-15) == "killed by signal SIGTERM"
    assert signal_description(-200) == "killed by signal signal 200"


def test_waiting_on_a_worker_that_died_fails_at_once_saying_how_it_ended(tmp_path: Path) -> None:
    tree = spawn(tmp_path, "import sys; sys.exit(5)")
    # without the process the wait would time out after 60 s with another message
    with pytest.raises(AssertionError, match=r"ended \(exit status 5\) before .*never to appear"):
        wait_for(tmp_path / "never", timeout=60, process=tree)
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    popen = subprocess.Popen([sys.executable, "-c", suicide])
    with pytest.raises(AssertionError, match=rf"process {popen.pid} ended \(exit status -9\)"):
        wait_for(tmp_path / "never", timeout=60, process=popen)
