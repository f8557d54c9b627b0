"""The journal's one rule: a record is repaired only once its owner's lock can be taken, that is once the
process that wrote it is gone, by the next stella command; a kind this stella does not know is said in
one line; a journal with no record costs the command a directory listing and no import."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths

# A stand-in stella process: it writes one record of the given kind and lives on until killed.
OWNER = """
import sys, time
from pathlib import Path
from stellafleet.state import journal
exclusive = sys.argv[5:] == ["exclusive"]  # as a merge writes its record: one per repository
journal.owner(Path(sys.argv[1])).write(sys.argv[2], sys.argv[3], path=sys.argv[4], exclusive=exclusive)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.fixture
def owners() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def start_owner(
    owners: list[subprocess.Popen[str]], root: Path, name: str, kind: str, path: Path, *more: str
) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", OWNER, str(root), name, kind, str(path), *more]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    owners.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def journal_files(root: Path) -> list[str]:
    return sorted(p.name for p in StatePaths(root).journal.iterdir() if p.suffix in (".json", ".lock"))


@pytest.mark.parametrize("how", [(), ("exclusive",)], ids=["record", "exclusive-record"])
def test_a_record_whose_owner_lives_is_never_repaired(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, owners: list[subprocess.Popen[str]], how: tuple[str]
) -> None:
    kept = tmp_path / "stella-commit-live"
    kept.mkdir()
    start_owner(owners, git_repo, "scratch-live", "scratch", kept, *how)
    before = journal_files(git_repo)
    for _ in range(2):
        done = stella("runs", cwd=git_repo)
        assert "Traceback" not in done.stderr
    assert kept.is_dir()  # the live owner's scratch directory is left alone
    assert journal_files(git_repo) == before and "scratch-live.json" in before


def test_a_record_whose_owner_was_killed_is_repaired_by_the_next_command(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, owners: list[subprocess.Popen[str]]
) -> None:
    left = tmp_path / "stella-commit-killed"
    left.mkdir()
    proc = start_owner(owners, git_repo, "scratch-killed", "scratch", left)
    kill(proc)
    assert left.is_dir() and "scratch-killed.json" in journal_files(git_repo)

    done = stella("runs", cwd=git_repo)

    assert "Traceback" not in done.stderr
    assert not left.exists()
    assert journal_files(git_repo) == []  # the record and its dead owner's lock are gone


def test_a_record_of_a_kind_this_stella_does_not_know_is_said_in_one_line_and_left(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, owners: list[subprocess.Popen[str]]
) -> None:
    kill(start_owner(owners, git_repo, "later", "a-kind-from-a-later-stella", tmp_path))
    record = StatePaths(git_repo).journal / "later.json"
    written = json.loads(record.read_text())

    done = stella("runs", cwd=git_repo)

    said = [line for line in done.stderr.splitlines() if "later.json" in line]
    assert len(said) == 1 and "'a-kind-from-a-later-stella'" in said[0], done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert json.loads(record.read_text()) == written


NO_IMPORTS = """
import sys
from pathlib import Path
from stellafleet.state.journal import recover
before = set(sys.modules)
recover(Path(sys.argv[1]))
print(sorted(m for m in set(sys.modules) - before if m.startswith("stellafleet")))
"""


def test_a_journal_with_no_dead_owner_costs_no_import(
    git_repo: Path, tmp_path: Path, owners: list[subprocess.Popen[str]]
) -> None:
    StatePaths(git_repo).journal.mkdir(parents=True)
    script = [sys.executable, "-c", NO_IMPORTS, str(git_repo)]
    assert subprocess.run(script, capture_output=True, text=True, check=True).stdout == "[]\n"
    start_owner(owners, git_repo, "scratch-live", "scratch", tmp_path)  # a live owner's record
    assert subprocess.run(script, capture_output=True, text=True, check=True).stdout == "[]\n"
