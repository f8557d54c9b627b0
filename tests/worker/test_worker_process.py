"""Worker process trees: own session, exact exit status, measured CPU and memory, stopped as a whole."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
from helpers.fleet import wait_exit

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
        "end = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    )
    tree = spawn(tmp_path, code)
    time.sleep(0.3)
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
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchildren = [int(pid) for pid in log.read_text().split()]
    tree.sample()
    tree.signal_tree(signal.SIGKILL)
    done = wait_exit(tree)
    assert done.describe() == "killed by signal SIGKILL"
    for pid in grandchildren:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"grandchild {pid} survived")


def test_signal_descriptions() -> None:
    assert signal_description(0) == "exit status 0"
    assert signal_description(-9) == "killed by signal SIGKILL"
    assert signal_description(-15) == "killed by signal SIGTERM"
    assert signal_description(-200) == "killed by signal signal 200"
