"""Issue 49 item 8: a full disk during a run is the user's to free, not a bug. A worker fills the
repository's file system (a real 4 MiB tmpfs, mounted in a mount namespace of the fleet's own); the fleet
stops, records the run's end in the room it kept, says `disk full at PATH: free space, then stella fleet
--resume RUN` and exits 2. Nothing fills a real disk: the tmpfs is the whole file system the run sees."""

from __future__ import annotations

import errno
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fleet import by_id, run_record
from helpers.needs import missing
from helpers.repo import GIT_EMAIL, GIT_NAME

import stellafleet
from stellafleet.core.errors import DiskFull, GitError, is_disk_full
from stellafleet.core.status import Stop, StopReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.diskfull import ROOM_BYTES, FullDisk
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

FILL = "dd if=/dev/zero of=big bs=64k 2>/dev/null; echo filled"
SCRIPT = """
set -e
mount -t tmpfs -o size=4m tmpfs "$DISK"
cd "$DISK" && git init -q -b main repo && cd repo
git -c user.name="$NAME" -c user.email="$EMAIL" commit -q --allow-empty -m start
mkdir .stella && printf '[pipelines.command]\\nrun = "%s"\\n' "$FILL" > .stella/config.toml
set +e
"$PY" -m stellafleet fleet --pipeline command "fill the disk" "after it" 2> "$OUT/stderr"
echo $? > "$OUT/rc"
cp -r .stella "$OUT/state"
"""


def test_a_full_disk_stops_the_run_with_one_line_and_exit_2(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        missing("unshare (util-linux) is not installed: no private tmpfs to fill")
    probe = subprocess.run([unshare, "-rm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path)])
    if probe.returncode != 0:
        missing("cannot mount a tmpfs in a user and mount namespace here (unshare -rm)")
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    env = {
        "DISK": str(disk), "OUT": str(out), "PY": sys.executable, "FILL": FILL, "NAME": GIT_NAME,
        "EMAIL": GIT_EMAIL, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
        "PYTHONPATH": str(Path(stellafleet.__file__).parents[1]),
    }  # fmt: skip
    subprocess.run([unshare, "-rm", "sh", "-c", SCRIPT], env=env, check=True, timeout=120)

    stderr = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "2", stderr
    assert "internal error" not in stderr
    record = _record(out)
    run_id = record["run"]["id"]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stella: error: disk full at ") and last.endswith(
        f": free space, then stella fleet --resume {run_id}"
    ), shlex.quote(stderr)
    assert record["run"]["status"] == "interrupted" and record["run"]["exit_code"] == 2  # not left running
    assert record["run"]["reason"] == last.removeprefix("stella: error: ")
    tasks = by_id(record["tasks"])
    assert tasks["t2"]["status"] in ("skipped", "interrupted")  # nothing started after it: --resume runs it
    assert "disk full at " in tasks["t2"]["reason"]
    assert all(attempt["outcome"] != "running" for attempt in record["attempts"])


def _record(out: Path) -> dict[str, object]:
    """The run as the ledger copied out of the namespace holds it."""
    root = out / "root"
    root.mkdir()
    (out / "state").rename(root / ".stella")
    return run_record(root)


def test_each_kind_of_full_disk_is_one_and_nothing_else_is() -> None:
    """SQLite's, ENOSPC's and git's words for a full disk (the fleet's, stella commit's and every command's);
    a locked database, another OSError and another git failure are not."""
    full = sqlite3.OperationalError("database or disk is full")
    assert is_disk_full(full) and is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(GitError("git commit: error: unable to write: No space left on device"))
    assert is_disk_full(DiskFull("/repo/.stella/private/fleet.db", "r-1"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(GitError("git commit: nothing to commit"))
    assert str(DiskFull("/repo", "r-1")) == "disk full at /repo: free space, then stella fleet --resume r-1"
    assert str(DiskFull("/repo")) == "disk full at /repo: free space, then run the command again"


def test_the_first_full_disk_stops_the_run_frees_the_room_and_records_the_run(tmp_path: Path) -> None:
    """The same decisions in process, at their seam (a task's execution raising SQLite's full disk), for
    machines where no tmpfs can be mounted."""
    run_id = "r-20261201-090000-f011"
    (tmp_path / ".stella" / "private").mkdir(parents=True)
    full = FullDisk(tmp_path, run_id)
    full.keep_room()
    assert full.room.stat().st_size == ROOM_BYTES
    stops: list[Stop] = []
    stopped_workers: list[bool] = []

    def execute(task: PlanTask) -> bool:
        raise sqlite3.OperationalError("database or disk is full")

    guarded = full.guard(execute, stops.append, lambda: stopped_workers.append(True))
    for task_id in ("a", "b"):
        with pytest.raises(sqlite3.OperationalError):
            guarded(PlanTask(task_id, "p", "t"))
    said = f"disk full at {tmp_path}: free space, then stella fleet --resume {run_id}"
    assert stops == [Stop(StopReason.DISK_FULL, said)] and stopped_workers == [True]  # the first one only
    assert not full.room.exists()

    with Ledger.open(tmp_path / "fleet.db") as ledger:
        add_run(ledger, run_id)
        ledger.tasks.add(run_id, [PlanTask("a", "p", "t"), PlanTask("b", "p", "t")], {"a": 1, "b": 2})
        ledger.attempts.start(run_id, "a", pipeline="command")
        assert str(full.record(ledger)) == said
        record = ledger.get_run(run_id)
    assert (record["run"]["status"], record["run"]["exit_code"], record["run"]["reason"]) == (
        "interrupted",
        2,
        said,
    )
    assert [a["outcome"] for a in record["attempts"]] == ["abandoned"]
    assert {t["status"] for t in record["tasks"]} == {"interrupted"}
