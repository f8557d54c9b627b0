"""Eight real processes fighting over overlapping paths: exclusive holds, no escaped lock errors."""

from __future__ import annotations

import itertools
import os
import random
import re
import time
from pathlib import Path

import pytest
from helpers.spawn import run_together

from stellafleet.core.errors import ClaimConflict
from stellafleet.state.claims import ClaimStore, Holder

PROCESSES = 8
CYCLES = 400
POOL = [f"src/mod{i}.py" for i in range(12)]
CONFLICT = re.compile(
    r'claim conflict: (?P<path>\S+) is held by task "(?P<task>t\d)" \(Task \d\) '
    r"\(run (?P<run>r-[AB]), pid (?P<pid>\d+)\)"
)


def _marker(marks: Path, path: str) -> Path:
    return marks / path.replace("/", "__")


def _fighter(store_path: str, marks_dir: str, log_dir: str, n: int, barrier: object, out: object) -> None:
    """Acquire random overlapping path sets, prove exclusivity inside each hold, release; report all."""
    rng = random.Random(n)
    marks = Path(marks_dir)
    run_id = "r-A" if n % 2 else "r-B"  # two fleet runs sharing one repository
    report: dict = {
        "pid": os.getpid(),
        "held": 0,
        "conflicts": 0,
        "named_pids": set(),
        "errors": [],
        "overlaps": [],
    }
    log_lines: list[str] = []
    with ClaimStore.open(Path(store_path)) as store:
        barrier.wait()  # type: ignore[attr-defined]
        for cycle in range(CYCLES):
            attempt = n * 1_000_000 + cycle
            me = Holder.current(run_id, f"t{n}", f"Task {n}", attempt)
            paths = rng.sample(POOL, rng.randint(1, 3))
            try:
                store.acquire(paths, me)
            except ClaimConflict as exc:
                match = CONFLICT.fullmatch(str(exc))
                if match is None or match["path"] not in paths or match["task"] == f"t{n}":
                    report["errors"].append(f"bad conflict message: {exc}")
                else:
                    report["conflicts"] += 1
                    report["named_pids"].add(int(match["pid"]))
                continue
            except Exception as exc:
                report["errors"].append(f"{type(exc).__name__}: {exc}")
                continue
            start = time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for every process on the machine
            made = []
            for path in paths:
                marker = _marker(marks, path)
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    report["overlaps"].append(f"{path} already marked while {os.getpid()} held it")
                    continue
                os.close(fd)
                made.append(marker)
            if rng.random() < 0.3:
                time.sleep(0.0005)
            for marker in made:
                os.unlink(marker)
            end = time.monotonic_ns()
            try:
                store.release_attempt(run_id, attempt)
            except Exception as exc:
                report["errors"].append(f"release: {type(exc).__name__}: {exc}")
            report["held"] += 1
            log_lines += [f"{start} {end} {os.getpid()} {path}\n" for path in paths]
    with open(Path(log_dir) / f"{n}.log", "a") as log:
        log.writelines(log_lines)
    out.put(report)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_eight_processes_never_hold_a_path_at_once(tmp_path: Path) -> None:
    store_path = tmp_path / "store.db"
    marks, logs = tmp_path / "marks", tmp_path / "logs"
    marks.mkdir()
    logs.mkdir()
    reports = run_together(_fighter, lambda n: (str(store_path), str(marks), str(logs), n), PROCESSES)
    pids = {r["pid"] for r in reports}

    assert [e for r in reports for e in r["errors"]] == []  # no "database is locked", no malformed conflict
    assert [o for r in reports for o in r["overlaps"]] == []
    held = sum(r["held"] for r in reports)
    conflicts = sum(r["conflicts"] for r in reports)
    assert held + conflicts == PROCESSES * CYCLES
    assert held > PROCESSES * CYCLES // 10 and conflicts > 0  # real contention, and real progress
    assert set().union(*(r["named_pids"] for r in reports)) <= pids

    # The hold windows each process logged never overlap on one path across processes.
    windows: dict[str, list[tuple[int, int, str]]] = {}
    for log in logs.iterdir():
        for line in log.read_text().splitlines():
            start, end, pid, path = line.split()
            windows.setdefault(path, []).append((int(start), int(end), pid))
    for path, spans in windows.items():
        spans.sort()
        for (_, end, pid), (next_start, _, next_pid) in itertools.pairwise(spans):
            assert end < next_start, f"{path} held by {pid} and {next_pid} at once"
    with ClaimStore.open(store_path) as store:
        assert store.claims() == []


def _lane_user(store_path: str, marks_dir: str, n: int, barrier: object, out: object) -> None:
    marker = Path(marks_dir) / "in-lane"
    overlaps = 0
    with ClaimStore.open(Path(store_path)) as store:
        barrier.wait()  # type: ignore[attr-defined]
        for i in range(25):
            with store.commit_lane(Holder.current("r-L", f"t{n}", "", i), timeout=30):
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    overlaps += 1
                    continue
                time.sleep(0.0002)
                os.unlink(marker)
    out.put(overlaps)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_commit_lane_admits_one_process_at_a_time(tmp_path: Path) -> None:
    store_path, marks = tmp_path / "store.db", tmp_path / "marks"
    marks.mkdir()
    overlaps = run_together(_lane_user, lambda n: (str(store_path), str(marks), n), 4)
    assert overlaps == [0, 0, 0, 0]
