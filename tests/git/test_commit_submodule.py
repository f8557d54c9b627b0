"""A worker commits a submodule's pointer update with `stella commit <submodule path>`."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import RUN, make_attempt
from helpers.repo import StellaRunner, git

from stellafleet.state.ledger import Ledger

AS_U = ("-c", "user.name=Upstream", "-c", "user.email=upstream@example.invalid")


def test_a_submodule_pointer_update_is_committed_and_recorded(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    upstream = tmp_path / "lib"
    upstream.mkdir()
    git("init", "-q", "-b", "main", cwd=upstream)
    git(*AS_U, "commit", "-q", "--allow-empty", "-m", "one", cwd=upstream)
    add = ("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(upstream), "vendor/lib")
    git(*add, cwd=git_repo)
    git("commit", "-q", "-m", "add the lib submodule", cwd=git_repo)
    sub = git_repo / "vendor" / "lib"
    git(*AS_U, "commit", "-q", "--allow-empty", "-m", "two", cwd=sub)
    bumped = git("rev-parse", "HEAD", cwd=sub).strip()
    ctx = make_attempt(git_repo)

    proc = stella("commit", "-m", "Bump lib", "vendor/lib", cwd=git_repo, env=ctx.to_env())

    assert proc.returncode == 0, proc.stderr
    sha = proc.stdout.strip()
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == sha
    assert git("ls-tree", "HEAD", "vendor/lib", cwd=git_repo).split()[:3] == ["160000", "commit", bumped]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        assert [(c["sha"], c["message"]) for c in ledger.get_run(RUN)["commits"]] == [(sha, "Bump lib")]
    # a plain directory is still refused by name
    (git_repo / "docs").mkdir()
    (git_repo / "docs" / "a.md").write_text("a\n")
    refused = stella("commit", "-m", "docs", "docs", cwd=git_repo, env=ctx.to_env())
    assert refused.returncode == 2 and "it is a directory" in refused.stderr
