"""`stella clean` then `stella clean --salvage`: a salvage ref that alone holds a deleted branch's commits
is kept, named, unless --force."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.git import clean, gitops, salvage, worktrees
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN = "r-20261201-090000-cccc"


def _killed_isolated_task(repo: Path) -> tuple[str, str]:
    """A run killed while its isolated task had one commit on its branch and more work uncommitted:
    returns (the commit, the salvage ref)."""
    name = worktrees.isolated_name(RUN, "half")
    path = StatePaths(repo).worktrees / name
    branch = f"fleet/{name}"
    gitops.ensure_excluded(repo, [".stella/"])
    worktrees.worktree_add(repo, path, branch, gitops.head_commit(repo))
    (path / "done.txt").write_text("committed by the worker\n")
    git("add", "done.txt", cwd=path)
    git("commit", "-q", "-m", "worker's commit", cwd=path)
    commit = gitops.head_commit(path)
    (path / "more.txt").write_text("not committed yet\n")
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        add_run(ledger, RUN, base_commit=commit, root=str(repo), pid=999_999_999)
        ledger.tasks.add(RUN, [sample_task("half", isolation="isolated")], {"half": 1})
        ledger.tasks.set_workspace(RUN, "half", branch, str(path))
        attempt = ledger.attempts.start(RUN, "half", pipeline="command", branch=branch, worktree=str(path))
        ledger.runs.finish(RUN, "interrupted", exit_code=130)
    ref = salvage.salvage_ref(RUN, "half", attempt)
    assert salvage.salvage(path, ref, message="salvage") is not None
    return commit, ref


def test_a_second_clean_with_salvage_keeps_the_ref_that_alone_holds_a_deleted_branchs_commit(
    git_repo: Path,
) -> None:
    commit, ref = _killed_isolated_task(git_repo)
    first = clean.clean(git_repo)
    assert {item.kind for item in first.with_action(clean.REMOVED)} == {"worktree", "branch"}

    second = clean.clean(git_repo, salvage_refs=True)

    [kept] = second.with_action(clean.KEPT)
    assert (kept.kind, kept.target) == ("salvage", ref)
    assert kept.reason.startswith("holds 1 commit no branch holds"), kept.reason
    assert git("rev-parse", ref, cwd=git_repo).strip()
    assert git("merge-base", "--is-ancestor", commit, ref, cwd=git_repo) == ""

    forced = clean.clean(git_repo, salvage_refs=True, force=True)
    [gone] = forced.with_action(clean.REMOVED)
    assert gone.reason.endswith("with 1 commit no branch holds, by --force"), gone.reason
