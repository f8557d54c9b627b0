"""What a Ray node's part of an attempt (run/raytask.py, called here in this process as a node calls it)
reports when git fails there: git's error as the attempt's, not a worker "lost" with SIGKILL's -9."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from helpers.fleet import worker_context
from helpers.repo import git

from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import ENV_PROMPT_MAX_BYTES
from stellafleet.git import bundle
from stellafleet.run.raytask import RemoteSpec, checkout, remote_attempt


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


@pytest.mark.parametrize("cache", ["kept", "none"])
def test_a_start_bundle_checks_the_branch_out_at_its_commit(
    git_repo: Path, tmp_path: Path, monkeypatch, cache: str
) -> None:
    """--from-salvage on a node: the checkout holds the salvage commit's work, staged on its parent, in the
    kept clone or, where the node cannot keep one (its cache is not writable), in a clone of its own."""
    base = git("rev-parse", "HEAD", cwd=git_repo).strip()
    (git_repo / "half.txt").write_text("half way\n")
    git("add", "half.txt", cwd=git_repo)
    git("commit", "-q", "-m", "salvaged", cwd=git_repo)
    start = git("rev-parse", "HEAD", cwd=git_repo).strip()
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("STELLA_NODE_CACHE", str(tmp_path / ("cache" if cache == "kept" else "not-a-dir/x")))
    bundle.create_base(git_repo, base, tmp_path / "base.bundle", tag="r-1")
    bundle.create_start(git_repo, start, base, tmp_path / "start.bundle", tag="r-1-t1")
    ctx = worker_context(git_repo, isolation="isolated", branch="fleet/t1-0123456789abcdef", base_commit=base)
    (tmp_path / "scratch").mkdir()
    repo = tmp_path / "scratch" / "repo"

    clone = checkout(
        ctx,
        (tmp_path / "base.bundle").read_bytes(),
        repo,
        (tmp_path / "start.bundle").read_bytes(),
        fold=True,
    )  # a salvage start; a stacked task's parents' commit is checked out as it is (test_ray_executor.py)

    assert (clone is not None) == (cache == "kept")
    assert git("rev-parse", "HEAD", cwd=repo).strip() == base  # the salvage folds into the next commit
    assert git("diff", "--cached", "--name-only", cwd=repo).split() == ["half.txt"]
    assert git("branch", "--show-current", cwd=repo).strip() == "fleet/t1-0123456789abcdef"
    assert (repo / "half.txt").read_text() == "half way\n"
    assert git("for-each-ref", "refs/stella/", cwd=clone or repo) == ""  # no temporary ref left behind
    assert git("for-each-ref", "refs/stella/", cwd=git_repo) == ""


def test_the_worker_on_a_node_reads_its_whole_prompt_from_a_file_there(
    git_repo: Path, tmp_path: Path, monkeypatch
) -> None:
    """The fleet's prompt file is on the fleet's machine: a prompt too large for the environment must
    reach the node's worker in a file of the node's."""
    monkeypatch.setenv("STELLA_NODE_CACHE", str(tmp_path / "cache"))
    base = git("rev-parse", "HEAD", cwd=git_repo).strip()
    bundle.create_base(git_repo, base, tmp_path / "base.bundle", tag="r-1")
    prompt = "do the thing carefully. " * (ENV_PROMPT_MAX_BYTES // 10)
    seen = tmp_path / "seen.txt"
    ctx = worker_context(
        git_repo, isolation="isolated", branch="fleet/t1-0123456789abcdef", base_commit=base, token="tok"
    )
    ctx = dataclasses.replace(ctx, prompt=prompt, prompt_path=tmp_path / "on-the-fleets-machine.txt")
    config = f'[pipelines.command]\nrun = "cp \\"$STELLA_PROMPT_FILE\\" {seen}"\n'

    events = list(
        remote_attempt(
            RemoteSpec(context=ctx, config_layers=(("project", config),)),
            (tmp_path / "base.bundle").read_bytes(),
        )
    )

    assert events[-1]["kind"] == "finished"
    assert seen.read_text() == prompt


def test_the_setup_on_a_node_counts_its_cpu_in_the_attempts(
    git_repo: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("STELLA_NODE_CACHE", str(tmp_path / "cache"))
    base = git("rev-parse", "HEAD", cwd=git_repo).strip()
    bundle.create_base(git_repo, base, tmp_path / "base.bundle", tag="r-1")
    ctx = worker_context(git_repo, isolation="isolated", branch="fleet/t1-0123456789abcdef", base_commit=base)
    burn = "import time; end = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    (tmp_path / "burn.py").write_text(burn)
    setup = f"{sys.executable} {tmp_path / 'burn.py'}"  # about 0.6 s of CPU; the worker alone about 0.3 s
    config = f'[pipelines.command]\nrun = "true"\n\n[worktree]\nsetup = "{setup}"\n'

    events = list(
        remote_attempt(
            RemoteSpec(context=ctx, config_layers=(("project", config),)),
            (tmp_path / "base.bundle").read_bytes(),
        )
    )

    end = events[-1]["end"]
    assert end.outcome == AttemptOutcome.SUCCEEDED and end.cpu_seconds >= 0.6, end
