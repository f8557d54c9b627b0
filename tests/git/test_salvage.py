"""git/salvage.py on real repositories: the commit holds exactly the unfinished work, and building it never
touches the workspace's files or index."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.git import dirty, salvage
from stellafleet.run import salvaging
from stellafleet.state.ledger import Ledger


def _state(root: Path) -> tuple[str, str, str]:
    """What the user sees: status (with ignored files), the staged diff and the work tree's diff."""
    return (
        git("status", "--porcelain", "--ignored", "--untracked-files=all", cwd=root),
        git("diff", "--cached", cwd=root),
        git("diff", cwd=root),
    )


def _files(root: Path, sha: str) -> dict[str, str]:
    """path -> content of every file the commit changed from its parent (deleted: '<deleted>')."""
    names = git("diff-tree", "-r", "--no-commit-id", "--name-status", f"{sha}^", sha, cwd=root).splitlines()
    out = {}
    for line in names:
        status, path = line.split("\t")
        out[path] = "<deleted>" if status == "D" else git("show", f"{sha}:{path}", cwd=root)
    return out


def test_an_isolated_salvage_holds_the_whole_worktree_but_ignored_files_and_touches_nothing(
    git_repo: Path, tmp_path: Path
) -> None:
    (git_repo / ".gitignore").write_text("*.log\n")
    (git_repo / "gone.txt").write_text("old\n")
    git("add", "-A", cwd=git_repo)
    git("commit", "-q", "-m", "base", cwd=git_repo)
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t", str(tree), "HEAD", cwd=git_repo)
    (tree / "README.md").write_text("changed\n")
    (tree / "new.txt").write_text("new\n")
    (tree / "staged.txt").write_text("staged\n")
    git("add", "staged.txt", cwd=tree)
    (tree / "debug.log").write_text("ignored\n")
    (tree / "gone.txt").unlink()
    before = _state(tree)
    head = git("rev-parse", "HEAD", cwd=tree).strip()

    saved = salvage.salvage(tree, salvage.salvage_ref("r-1", "t", 3), message="salvage t")

    assert saved is not None and saved.ref == "refs/stella/salvage/r-1/t/3"
    assert git("rev-parse", saved.ref, cwd=git_repo).strip() == saved.sha
    assert git("rev-parse", f"{saved.sha}^", cwd=git_repo).strip() == head  # on the worktree's HEAD
    assert _files(git_repo, saved.sha) == {
        "README.md": "changed\n",
        "new.txt": "new\n",
        "staged.txt": "staged\n",
        "gone.txt": "<deleted>",
    }
    assert saved.files == 4
    assert _state(tree) == before  # files, index and status exactly as they were
    assert git("rev-parse", "HEAD", cwd=tree).strip() == head
    # the same work again is the same tree: the salvage holds the worktree, so clean may let it go
    found = salvage.holds_worktree(git_repo, tree, "r-1", "t")
    assert found is not None and found.sha == saved.sha
    (tree / "more.txt").write_text("later\n")
    assert salvage.holds_worktree(git_repo, tree, "r-1", "t") is None


def test_a_shared_salvage_holds_only_the_claimed_paths_and_leaves_the_users_work_alone(
    git_repo: Path,
) -> None:
    (git_repo / "mine.txt").write_text("base\n")
    git("add", "mine.txt", cwd=git_repo)
    git("commit", "-q", "-m", "base", cwd=git_repo)
    (git_repo / "mine.txt").write_text("the user's own edit\n")  # not claimed: the user's
    (git_repo / "staged-by-user.txt").write_text("staged\n")
    git("add", "staged-by-user.txt", cwd=git_repo)
    (git_repo / "claimed.txt").write_text("the task's work\n")
    (git_repo / "README.md").write_text("the task changed this too\n")
    before = _state(git_repo)
    head = git("rev-parse", "HEAD", cwd=git_repo).strip()

    saved = salvage.salvage(
        git_repo, "refs/stella/salvage/r-1/t/1", paths=["claimed.txt", "README.md"], message="salvage"
    )

    assert saved is not None
    assert git("rev-parse", f"{saved.sha}^", cwd=git_repo).strip() == head
    assert _files(git_repo, saved.sha) == {
        "claimed.txt": "the task's work\n",
        "README.md": "the task changed this too\n",
    }
    assert _state(git_repo) == before
    assert git("diff", "--cached", "--name-only", cwd=git_repo) == "staged-by-user.txt\n"


def test_nothing_uncommitted_makes_no_salvage(git_repo: Path) -> None:
    (git_repo / "x.log").write_text("ignored")
    assert salvage.salvage(git_repo, "refs/stella/salvage/r/t/1", paths=["README.md"], message="m") is None
    assert salvage.salvage_refs(git_repo) == []


def test_a_repository_without_an_identity_still_gets_its_work_kept(git_repo: Path) -> None:
    git("config", "--unset", "user.name", cwd=git_repo)
    git("config", "--unset", "user.email", cwd=git_repo)
    (git_repo / "README.md").write_text("edit\n")
    saved = salvage.salvage(git_repo, "refs/stella/salvage/r/t/1", paths=["README.md"], message="m")
    assert saved is not None
    assert git("log", "-1", "--format=%an", saved.sha, cwd=git_repo).strip() == "stella salvage"


def test_refs_are_listed_by_run_and_the_latest_of_a_task_wins(git_repo: Path) -> None:
    for attempt in (2, 10):
        (git_repo / "README.md").write_text(f"attempt {attempt}\n")
        salvage.salvage(git_repo, salvage.salvage_ref("r-1", "t", attempt), paths=["README.md"], message="m")
    (git_repo / "README.md").write_text("other run\n")
    salvage.salvage(git_repo, salvage.salvage_ref("r-2", "t", 1), paths=["README.md"], message="m")

    assert {ref.parts for ref in salvage.salvage_refs(git_repo, "r-1")} == {
        ("r-1", "t", "2"),
        ("r-1", "t", "10"),
    }
    latest = salvage.latest_salvage(git_repo, "r-1", "t")
    assert latest is not None and latest.parts == ("r-1", "t", "10")
    assert git("show", f"{latest.sha}:README.md", cwd=git_repo) == "attempt 10\n"
    assert salvage.older_than(salvage.salvage_refs(git_repo), 1.0) == []  # all made just now
    assert (
        len(salvage.older_than(salvage.salvage_refs(git_repo), 1.0, now_s=latest.created_s + 2 * 86400)) == 3
    )
    salvage.delete_salvage(git_repo, latest)
    assert salvage.latest_salvage(git_repo, "r-1", "t") is not None  # attempt 2 is left
    assert len(salvage.salvage_refs(git_repo)) == 2


def test_a_branch_whose_commits_a_salvage_ref_holds_loses_nothing_when_deleted(git_repo: Path) -> None:
    git("switch", "-q", "-c", "fleet/a", cwd=git_repo)
    (git_repo / "a.txt").write_text("a\n")
    git("add", "a.txt", cwd=git_repo)
    git("commit", "-q", "-m", "a", cwd=git_repo)
    git("switch", "-q", "main", cwd=git_repo)
    assert salvage.held_elsewhere(git_repo, "fleet/a") == 1
    git("update-ref", "refs/stella/salvage/r/t/1", "fleet/a", cwd=git_repo)
    assert salvage.held_elsewhere(git_repo, "fleet/a") == 0
    git("update-ref", "-d", "refs/stella/salvage/r/t/1", cwd=git_repo)
    git("branch", "user-copy", "fleet/a", cwd=git_repo)
    assert salvage.held_elsewhere(git_repo, "fleet/a") == 0


def test_a_checkout_holding_stellas_own_ignored_state_is_salvaged_without_it(
    git_repo: Path, tmp_path: Path
) -> None:
    """A Ray node's checkout holds the attempt's `.stella/private/` (its scratch ledger, its result): git
    refuses an exclude pathspec naming an ignored directory that exists, and the salvage must not fail."""
    tree = tmp_path / "node-checkout"
    git("worktree", "add", "-q", "-b", "fleet/n", str(tree), "HEAD", cwd=git_repo)
    (git_repo / ".git" / "info" / "exclude").write_text(".stella/private/\n.stella/worktrees/\n")
    (tree / ".stella" / "private" / "results").mkdir(parents=True)
    (tree / ".stella" / "private" / "results" / "t-1.json").write_text("{}\n")
    (tree / "half.txt").write_text("half way\n")

    saved = salvage.salvage(tree, salvage.salvage_ref("r-1", "n", 1), message="salvage n")

    assert saved is not None and _files(git_repo, saved.sha) == {"half.txt": "half way\n"}


def test_a_shared_salvage_under_allow_dirty_keeps_the_workers_change_without_the_users_edits(
    git_repo: Path,
) -> None:
    """The run's dirty record holds the user's own edits to claimed files: a salvage takes HEAD's version
    plus the worker's change, as `stella commit` would, and never the user's edits as the worker's work."""
    (git_repo / "both.txt").write_text("a\nb\nc\nd\ne\n")
    (git_repo / "mine.txt").write_text("untouched\n")
    git("add", "both.txt", "mine.txt", cwd=git_repo)
    git("commit", "-q", "-m", "base", cwd=git_repo)
    (git_repo / "both.txt").write_text("A, the user's\nb\nc\nd\ne\n")
    (git_repo / "mine.txt").write_text("the user's own edit\n")
    dirty.save(git_repo, "r-1", dirty.take(git_repo, ["both.txt", "mine.txt"]))  # --allow-dirty's record
    (git_repo / "both.txt").write_text("A, the user's\nb\nc\nd\nE, the worker's\n")  # the worker's edit

    saved = salvaging.salvage_workspace(git_repo, "r-1", "t", 1, "stalled", ["both.txt", "mine.txt"])

    assert saved is not None and saved.files == 1
    assert git("show", f"{saved.sha}:both.txt", cwd=git_repo) == "a\nb\nc\nd\nE, the worker's\n"
    assert git("show", f"{saved.sha}:mine.txt", cwd=git_repo) == "untouched\n"


def test_a_worktree_whose_git_the_worker_replaced_is_not_salvaged_into_its_inner_repository(
    git_repo: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/x", str(tree), "HEAD", cwd=git_repo)
    (tree / ".git").unlink()  # the worker ran `rm .git && git init` in its worktree
    git("init", "-q", cwd=tree)
    git(
        "-c",
        "user.name=W",
        "-c",
        "user.email=w@example.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "inner",
        cwd=tree,
    )
    (tree / "work.txt").write_text("the worker's\n")

    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        saved = salvaging.salvage_attempt(
            ledger, root=git_repo, run_id="r-1", task_id="t", attempt_id=1, worktree=tree, outcome="abandoned"
        )

    assert saved is None
    assert git("for-each-ref", "refs/stella/", cwd=tree) == ""  # nothing written into the inner repository
