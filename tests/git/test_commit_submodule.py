"""Submodules: a worker commits a submodule's pointer, a path inside one is refused naming it, and an
isolated task's worktree gets the submodules the main tree has (a real submodule: a local repository added
with `git submodule add`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import RUN, make_attempt, run_record, write_config
from helpers.repo import UPSTREAM_AUTHOR, StellaRunner, add_submodule, git

from stellafleet.core.errors import GitError
from stellafleet.git import submodules, worktrees
from stellafleet.state.ledger import Ledger


def test_a_submodule_pointer_update_is_committed_and_recorded(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    sub = add_submodule(git_repo, tmp_path)
    git(*UPSTREAM_AUTHOR, "commit", "-q", "--allow-empty", "-m", "two", cwd=sub)
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


def test_a_path_inside_a_submodule_is_refused_naming_the_submodule(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    sub = add_submodule(git_repo, tmp_path)
    (sub / "lib.c").write_text("int lib = 2;\n")
    ctx = make_attempt(git_repo)
    before = git("rev-parse", "HEAD", cwd=git_repo)

    proc = stella("commit", "-m", "Edit lib", "vendor/lib/lib.c", cwd=git_repo, env=ctx.to_env())

    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "vendor/lib/lib.c: it is inside the submodule vendor/lib" in lines[0]
    assert "Traceback" not in proc.stderr and "update-index" not in proc.stderr
    assert git("rev-parse", "HEAD", cwd=git_repo) == before


CHECKER = (
    "if [ -f vendor/lib/lib.c ]; then echo present > seen.txt; else echo empty > seen.txt; fi && "
    'stella commit -m "$STELLA_TASK_ID: what it saw" seen.txt'
)

PLAN = '[[tasks]]\nid = "t1"\nprompt = "look at the lib"\nisolation = "isolated"\n'


def test_an_isolated_worktree_gets_the_submodules_unless_turned_off(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    add_submodule(git_repo, tmp_path)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    seen = {}
    for setting in ("", "[fleet]\ninit_submodules = false\n"):
        write_config(git_repo, run=CHECKER, extra=setting)
        proc = stella("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record = run_record(git_repo)
        branch = record["tasks"][0]["branch"]
        seen[setting] = git("show", f"{branch}:seen.txt", cwd=git_repo).strip()
    assert seen == {"": "present", "[fleet]\ninit_submodules = false\n": "empty"}


def test_a_clean_worktree_with_initialised_submodules_can_still_be_removed(
    git_repo: Path, tmp_path: Path
) -> None:
    add_submodule(git_repo, tmp_path)
    wt = tmp_path / "wt"
    worktrees.worktree_add(git_repo, wt, "fleet/x", git("rev-parse", "HEAD", cwd=git_repo).strip())
    assert submodules.init_in_worktree(git_repo, wt) == ["vendor/lib"]
    assert (wt / "vendor" / "lib" / "lib.c").read_text() == "int lib;\n"
    (wt / "vendor" / "lib" / "lib.c").write_text("changed\n")
    with pytest.raises(GitError, match="submodules"):  # a submodule with changes keeps its worktree
        worktrees.worktree_remove(git_repo, wt)
    git("checkout", "lib.c", cwd=wt / "vendor" / "lib")
    worktrees.worktree_remove(git_repo, wt)
    assert not wt.exists()
