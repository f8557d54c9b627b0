"""What a Ray node's part of an attempt (run/raytask.py, called here in this process as a node calls it)
reports when git fails there: git's error as the attempt's, not a worker "lost" with SIGKILL's -9."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import worker_context
from helpers.repo import git

from stellafleet.core.status import AttemptOutcome
from stellafleet.git import bundle
from stellafleet.run.raytask import RemoteSpec, remote_attempt


def _base_bundle(git_repo: Path, tmp_path: Path) -> bytes:
    (git_repo / "big.txt").write_text("".join(f"line {n}\n" for n in range(2000)))
    git("add", "big.txt", cwd=git_repo)
    git("commit", "-q", "-m", "big", cwd=git_repo)
    out = tmp_path / "base.bundle"
    bundle.create_base(git_repo, git("rev-parse", "HEAD", cwd=git_repo).strip(), out, tag="r-1")
    return out.read_bytes()


def test_a_clone_of_corrupt_objects_reports_gits_error(git_repo: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STELLA_NODE_NAME", "node-a")
    data = bytearray(_base_bundle(git_repo, tmp_path))
    pack = data.index(b"PACK")
    for offset in range(pack + 40, len(data) - 40, 7):  # the pack's objects damaged, its header intact
        data[offset] ^= 0xFF
    ctx = worker_context(git_repo, isolation="isolated", branch="fleet/t1-0123456789abcdef")

    events = list(remote_attempt(RemoteSpec(context=ctx), bytes(data)))

    assert [event["kind"] for event in events] == ["started", "finished"]
    end = events[-1]["end"]
    assert end.outcome == AttemptOutcome.FAILED
    assert end.error.startswith("could not clone the base on node node-a: git fetch -q: "), end.error
    assert "SIGKILL" not in end.error and end.exit_code is None
