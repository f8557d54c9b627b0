"""Ctrl-C on a real `stella fleet` process: once lets workers finish, twice stops their process trees.

The signal goes to the fleet's whole process group, as a terminal sends it: workers run in their own
sessions, so only the fleet hears it. The tests synchronise on files the workers write.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from helpers.fleet import Scripts, by_id, file_locks, run_record, wait_for, write_config

PLAN = """\
[[tasks]]
id = "a"
prompt = "first of wave one"
claims = ["a.txt"]

[[tasks]]
id = "b"
prompt = "second of wave one"
claims = ["b.txt"]

[[tasks]]
id = "c"
prompt = "wave two"
depends_on = ["a"]

[[tasks]]
id = "d"
prompt = "wave two as well"
"""

WORKER = """\
child = subprocess.Popen(["sleep", "300"])  # a grandchild of the worker process
mark(f"{TASK}.grandchild", child.pid)
mark(f"{TASK}.started")
wait_file(MARKS / "go", timeout=120)
child.kill()
child.wait()
report(summary=f"{TASK} finished after the interrupt")
"""


class Fleet:
    """A `stella fleet` process in its own process group, its output read line by line."""

    def __init__(self, repo: Path, plan: Path, marks: Path) -> None:
        env = {**os.environ, "MARKS": str(marks)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command",
             "--max-concurrency", "2"],
            cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # what the terminal does

    def expect(self, fragment: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if fragment in line:
                return line
        raise AssertionError(f"no line with {fragment!r}; saw:\n" + "\n".join(self.seen))

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout)  # it ends at the end of the fleet's output: every line is queued
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _setup(git_repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    scripts = Scripts(tmp_path / "scripts")
    write_config(git_repo, run=scripts.python("worker", WORKER), extra="[fleet]\nstop_grace = 2\n")
    return plan, marks


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_one_ctrl_c_launches_nothing_more_and_lets_running_workers_finish(
    git_repo: Path, tmp_path: Path, isolated_home: Path
) -> None:
    plan, marks = _setup(git_repo, tmp_path)
    fleet = Fleet(git_repo, plan, marks)
    try:
        wait_for(marks / "a.started", process=fleet.proc)
        wait_for(marks / "b.started", process=fleet.proc)
        fleet.ctrl_c()
        line = fleet.expect("interrupt:")
        assert "waiting for 2 running workers; press Ctrl-C again to stop them" in line
        (marks / "go").write_text("go")  # the workers were not interrupted: they finish their work
        code = fleet.finish()
    finally:
        fleet.kill()

    assert code == 130, "\n".join(fleet.seen)
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert tasks["a"]["status"] == tasks["b"]["status"] == "succeeded"
    assert by_id(record["attempts"], key="task_id")["a"]["summary"] == "a finished after the interrupt"
    assert tasks["c"]["status"] == tasks["d"]["status"] == "skipped"
    assert tasks["c"]["reason"] == tasks["d"]["reason"] == "interrupted"
    assert not (marks / "c.started").exists() and not (marks / "d.started").exists()
    assert len(record["attempts"]) == 2
    assert record["run"]["status"] == "interrupted" and record["run"]["exit_code"] == 130
    assert record["run"]["finished_at_ms"] is not None
    assert file_locks(git_repo) == []


def test_a_second_ctrl_c_stops_the_workers_process_trees(
    git_repo: Path, tmp_path: Path, isolated_home: Path
) -> None:
    plan, marks = _setup(git_repo, tmp_path)
    fleet = Fleet(git_repo, plan, marks)
    try:
        wait_for(marks / "a.started", process=fleet.proc)
        wait_for(marks / "b.started", process=fleet.proc)
        fleet.ctrl_c()
        fleet.expect("press Ctrl-C again")
        fleet.ctrl_c()
        assert "stopping 2 running workers" in fleet.expect("interrupt: stopping")
        code = fleet.finish()
    finally:
        fleet.kill()

    assert code == 130, "\n".join(fleet.seen)
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    attempts = by_id(record["attempts"], key="task_id")
    for task in ("a", "b"):
        assert tasks[task]["status"] == "interrupted"
        assert attempts[task]["outcome"] == "interrupted" and attempts[task]["success"] == 0
        assert attempts[task]["error"].startswith("interrupted (worker killed by signal")
        assert attempts[task]["finished_at_ms"] is not None
        assert _gone(int((marks / f"{task}.grandchild").read_text())), f"{task}'s grandchild survived"
    assert tasks["c"]["status"] == tasks["d"]["status"] == "skipped"
    assert tasks["c"]["reason"] == tasks["d"]["reason"] == "interrupted"
    assert record["run"]["status"] == "interrupted" and record["run"]["exit_code"] == 130
    assert file_locks(git_repo) == []
    assert any("interrupted" in line and "a" in line for line in fleet.seen)


def test_a_hangup_stops_the_workers_and_leaves_the_ledger_consistent(
    git_repo: Path, tmp_path: Path, isolated_home: Path
) -> None:
    # Closing the terminal (or losing the ssh connection) sends SIGHUP. It used to kill the fleet outright:
    # exit 129, the run and its attempts left `running`, the claims held and the workers orphaned.
    plan, marks = _setup(git_repo, tmp_path)
    fleet = Fleet(git_repo, plan, marks)
    try:
        wait_for(marks / "a.started", process=fleet.proc)
        wait_for(marks / "b.started", process=fleet.proc)
        os.killpg(fleet.proc.pid, signal.SIGHUP)
        code = fleet.finish()
    finally:
        fleet.kill()

    assert code == 130, "\n".join(fleet.seen)
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    attempts = by_id(record["attempts"], key="task_id")
    for task in ("a", "b"):
        assert tasks[task]["status"] == "interrupted" and attempts[task]["outcome"] == "interrupted"
        assert _gone(int((marks / f"{task}.grandchild").read_text())), f"{task}'s grandchild survived"
    assert tasks["c"]["status"] == tasks["d"]["status"] == "skipped"
    assert record["run"]["status"] == "interrupted" and record["run"]["exit_code"] == 130
    assert file_locks(git_repo) == []
