"""A check run in an isolated task's own worktree (run/checking.py, git/checkedtree.py), in process on real
repositories: what the check changes there (the branch, HEAD, tracked files, the worktree and its `.git`)
is put back and fails it by name; what it leaves untracked is removed, not committed by the next round;
a stash it makes does not stay in the user's stash (issue 49 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import RUN, check_attempt
from helpers.repo import git

from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.run import checking
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")
BRANCH = "fleet/t1"


@pytest.fixture
def worktree(git_repo: Path, tmp_path: Path) -> Path:
    """The task's worktree on its branch, one commit of the task's on it; an ignored dependency folder."""
    (git_repo / ".gitignore").write_text("node_modules/\n")
    git("add", ".gitignore", cwd=git_repo)
    git("commit", "-q", "-m", "ignore", cwd=git_repo)
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", BRANCH, str(tree), cwd=git_repo)
    (tree / "work.txt").write_text("the task's work\n")
    git("add", "work.txt", cwd=tree)
    git("commit", "-q", "-m", "the task's commit", cwd=tree)
    (tree / "node_modules").mkdir()
    (tree / "node_modules" / "dep.js").write_text("installed\n")
    return tree


def _ended(root: Path, ledger: Ledger, tree: Path, check: str, task_id: str = "t1") -> str | None:
    """The end reason the Check step gives the succeeded attempt whose worktree is tree (None: passed)."""
    task = PlanTask(task_id, "p", "t", isolation="isolated", check=check)
    step, attempt = check_attempt(root, ledger, task, workspace=tree, isolation="isolated", branch=BRANCH)
    return step.ended(attempt, DONE).reason


def _tip(root: Path) -> str:
    return git("rev-parse", BRANCH, cwd=root).strip()


def test_a_check_that_resets_its_branch_is_put_back_and_fails_by_name(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    tip = _tip(git_repo)
    before = git("rev-parse", "HEAD~1", cwd=worktree).strip()

    reason = _ended(git_repo, ledger, worktree, "git reset -q --hard HEAD~1")

    assert reason == f"check failed: the check moved {BRANCH} from {tip[:7]} to {before[:7]}"
    assert _tip(git_repo) == tip and (worktree / "work.txt").exists()
    assert git("status", "--porcelain", cwd=worktree) == ""
    [row] = ledger.checks.of_run(RUN)
    assert row["exit_code"] == 0 and row["passed"] == 0  # it exited 0: it still did not pass
    assert f"the check moved {BRANCH}" in row["output_tail"]


def test_a_check_that_commits_is_taken_off_the_branch_and_fails(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    tip = _tip(git_repo)
    check = "echo generated > gen.txt && git add gen.txt && git commit -q -m 'by the check'"

    reason = _ended(git_repo, ledger, worktree, check)

    assert reason is not None and reason.startswith(f"check failed: the check moved {BRANCH} from {tip[:7]}")
    assert _tip(git_repo) == tip and not (worktree / "gen.txt").exists()


def test_a_red_checks_untracked_output_is_removed_and_ignored_files_stay(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    check = "mkdir -p dist && echo built > dist/out.js && echo cache > .cache && echo 'FAIL build' && exit 1"

    reason = _ended(git_repo, ledger, worktree, check)

    assert reason == "check failed (exit 1): FAIL build"
    # the next round's commit of leftovers finds nothing of the check's to commit
    assert git("status", "--porcelain", "--untracked-files=all", cwd=worktree) == ""
    assert (worktree / "node_modules" / "dep.js").exists()
    [row] = ledger.checks.of_run(RUN)
    assert "removed what the check left untracked: .cache dist/out.js" in row["output_tail"]


def test_a_checks_stash_does_not_stay_in_the_users_stash(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    (git_repo / "mine.txt").write_text("the user's edit\n")
    git("add", "mine.txt", cwd=git_repo)
    git("stash", "push", "-q", "-m", "MY-OWN-STASH", cwd=git_repo)
    before = git("stash", "list", "--format=%H %gs", cwd=git_repo)

    reason = _ended(git_repo, ledger, worktree, "echo scratch > scratch.txt && git stash -u -q")

    assert reason is None  # its result stands: the stash it made is only taken out again
    assert git("stash", "list", "--format=%H %gs", cwd=git_repo) == before
    [row] = ledger.checks.of_run(RUN)
    assert "the check changed the stash list" in row["output_tail"]


def test_each_change_a_check_makes_to_its_worktree_is_named_and_put_back(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    tip = _tip(git_repo)
    cases = [
        ("git checkout -q --detach", "the check detached HEAD"),
        ("git checkout -q -b elsewhere", "the check checked out elsewhere"),
        ("echo changed >> work.txt", "the check changed tracked files: work.txt"),
        ("git rm -q work.txt", "the check changed tracked files: work.txt"),
        ("rm .git", f"the check removed {worktree}/.git (repaired)"),
    ]
    for number, (check, said) in enumerate(cases):  # each in the worktree the one before put back
        assert _ended(git_repo, ledger, worktree, check, f"t{number}") == f"check failed: {said}"
        assert git("symbolic-ref", "--short", "HEAD", cwd=worktree).strip() == BRANCH, check
        assert git("rev-parse", "HEAD", cwd=worktree).strip() == tip == _tip(git_repo), check
        assert git("status", "--porcelain", "--untracked-files=all", cwd=worktree) == "", check
        assert (worktree / "work.txt").read_text() == "the task's work\n", check


def test_a_check_that_deletes_its_worktree_fails_by_name(
    git_repo: Path, worktree: Path, ledger: Ledger
) -> None:
    tip = _tip(git_repo)

    reason = _ended(git_repo, ledger, worktree, f"rm -rf {worktree}")

    assert reason == f"check failed: the check deleted its worktree {worktree}"
    assert _tip(git_repo) == tip  # the task's work is on its branch still
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""  # nothing ran there


def test_a_killed_fleets_check_has_the_worktree_it_ran_in_put_back(
    git_repo: Path, worktree: Path, tmp_path: Path
) -> None:
    tip = _tip(git_repo)
    git("reset", "-q", "--hard", "HEAD~1", cwd=worktree)  # what the check did before the fleet was killed
    (worktree / "dist.js").write_text("its build output\n")
    data = {"pid": 1, "tree": str(worktree), "branch": BRANCH, "commit": tip}
    assert checking.repair(git_repo, [journal.Record(tmp_path / "check-1.json", data)])
    assert _tip(git_repo) == tip and git("rev-parse", "HEAD", cwd=worktree).strip() == tip
    assert (worktree / "work.txt").exists() and (worktree / "dist.js").exists()  # not known to be its
