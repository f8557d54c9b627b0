"""`stella demo`: the offline quick-start fleet behaves as designed, in a scratch repository."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from helpers.repo import StellaRunner, git

from stellafleet.git import gitops


def test_the_demo_runs_a_real_fleet_and_explains_its_designed_failure(
    tmp_path: Path, stella: StellaRunner
) -> None:
    target = tmp_path / "my demo"  # a space: the closing hint must still be a working shell line
    proc = stella("demo", str(target), cwd=tmp_path, timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SIMULATED" in out and "no network, no API key" in out
    assert "stella fleet: max concurrency 4 (--max-concurrency)" in out
    assert re.search(r'claim conflict: CHANGELOG\.md is held by task "(changelog|release-notes)"', out)
    assert "(the fleet exited 1)" in out
    assert "SELECT a.task_id, a.branch, a.summary, a.error FROM attempts a" in out
    failed_rows = [
        line for line in out.splitlines() if re.match(r"(changelog|release-notes)\|\|claim conflict", line)
    ]
    assert len(failed_rows) == 1
    assert "everything behaved as designed" in out
    assert f"Look around: cd {shlex.quote(str(target))} && stella runs latest" in out

    branches = gitops.git("branch", "--list", "fleet/*", "--format=%(refname:short)", cwd=target).split()
    assert len(branches) == 1 and re.fullmatch(r"fleet/docs-[0-9a-f]{16}", branches[0])
    assert git("show", "--name-only", "--format=", branches[0], cwd=target).split() == ["docs/receipts.md"]
    shared = git("log", "--format=%s", "main", cwd=target).splitlines()
    assert {"Add the migration", "Read path", "Write path"} <= set(shared)
    assert git("status", "--porcelain", cwd=target) == ""


def test_without_a_directory_the_scratch_repository_is_removed(tmp_path: Path, stella: StellaRunner) -> None:
    proc = stella("demo", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = re.search(r"a scratch repository at (\S+)", proc.stdout)
    assert where and not Path(where.group(1)).exists()


def test_a_non_empty_directory_is_refused(tmp_path: Path, stella: StellaRunner) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("mine\n")
    proc = stella("demo", str(tmp_path / "busy"), cwd=tmp_path)
    assert proc.returncode == 2 and "is not empty" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["file"]


def test_the_demo_behaves_the_same_on_a_terminal(tmp_path: Path, isolated_home: Path) -> None:
    # On a terminal the live display re-reads the ledger while workers write it: the run must not change.
    import os
    import pty
    import select
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "demo", str(tmp_path / "demo")],
        cwd=tmp_path, stdin=follower, stdout=follower, stderr=follower,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while select.select([leader], [], [], 120)[0]:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the demo exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert proc.wait(timeout=60) == 0, screen[-3000:]
    assert "everything behaved as designed" in screen
