"""A shared commit never lands on a HEAD the user detached while it was being made.

`stella commit` checks for a detached HEAD before it runs the hooks and waits for the lane; the user's
`git checkout --detach` can come after that check (a fleet's hooks and lane wait take seconds). HEAD is
checked again under index.lock, just before the index and HEAD move. The test widens the window with a
pre-commit hook that runs the real `git checkout --detach` in the tree (as the user would while hooks
run), so the detach lands between the first check and the move every time.
"""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import RUN, make_attempt
from helpers.repo import StellaRunner, git

from stellafleet.state.ledger import Ledger

# the user's detach of the shared tree, while the hooks run (in the commit tree)
DETACHING_HOOK = '#!/bin/sh\nenv -u GIT_INDEX_FILE git -C "$SHARED_TREE" checkout -q --detach\n'


def test_a_head_detached_while_the_commit_runs_its_hooks_is_refused_and_nothing_moves(
    git_repo: Path, stella: StellaRunner
) -> None:
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(DETACHING_HOOK)
    hook.chmod(0o755)
    ctx = make_attempt(git_repo)
    before = git("rev-parse", "HEAD", cwd=git_repo).strip()
    (git_repo / "x.txt").write_text("the worker's\n")

    done = stella(
        "commit", "-m", "Add x", "x.txt", cwd=git_repo, env={**ctx.to_env(), "SHARED_TREE": str(git_repo)}
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(
        f"stella: error: HEAD is detached (at {before[:12]}): this shared-tree commit"
    )
    assert (git_repo / ".git" / "HEAD").read_text().strip() == before  # the hook detached it
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == before  # nothing committed onto it
    assert git("rev-parse", "main", cwd=git_repo).strip() == before
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""  # nothing left staged
    assert not (git_repo / ".git" / "index.lock").exists()
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        assert ledger.get_run(RUN)["commits"] == []
