"""`stella clean` then `stella clean --salvage`: a salvage ref that alone holds a deleted branch's commits
is kept, named, unless --force."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.git import clean, gitops, salvage, worktrees
from stellafleet.run import salvaging
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN = "r-20261201-090000-cccc"


def _worktree(repo: Path) -> Path:
    path = StatePaths(repo).worktrees / worktrees.isolated_name(RUN, "half")
    gitops.ensure_excluded(repo, [".stella/"])
    worktrees.worktree_add(repo, path, f"fleet/{path.name}", gitops.head_commit(repo))
    return path


def _record_killed(ledger: Ledger, repo: Path, path: Path, *, started: bool = True) -> int:
    """A run whose fleet was killed during its isolated task in path (started: its worker had started,
    else only its setup ran); the attempt's id."""
    branch = f"fleet/{path.name}"
    add_run(ledger, RUN, base_commit=gitops.head_commit(repo), root=str(repo), pid=999_999_999)
    ledger.tasks.add(RUN, [sample_task("half", isolation="isolated")], {"half": 1})
    ledger.tasks.set_workspace(RUN, "half", branch, str(path))
    attempt = ledger.attempts.start(RUN, "half", pipeline="command", branch=branch, worktree=str(path))
    if started:
        ledger.attempts.set_pid(attempt, 999_999_998)
    return attempt


def _killed(repo: Path, path: Path, *, started: bool = True) -> str:
    """The ledger of a finalised run killed during its isolated task in path, the task's salvage: its ref."""
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        attempt = _record_killed(ledger, repo, path, started=started)
        ledger.runs.finish(RUN, "interrupted", exit_code=130)
    ref = salvage.salvage_ref(RUN, "half", attempt)
    if not started:
        return ref
    assert salvage.salvage(path, ref, message="salvage") is not None
    return ref


def _killed_isolated_task(repo: Path) -> tuple[str, str]:
    """A run killed while its isolated task had one commit on its branch and more work uncommitted:
    returns (the commit, the salvage ref)."""
    path = _worktree(repo)
    (path / "done.txt").write_text("committed by the worker\n")
    git("add", "done.txt", cwd=path)
    git("commit", "-q", "-m", "worker's commit", cwd=path)
    commit = gitops.head_commit(path)
    (path / "more.txt").write_text("not committed yet\n")
    return commit, _killed(repo, path)


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


def test_a_worktree_holding_a_nested_repository_with_its_own_commits_is_kept_by_name(git_repo: Path) -> None:
    path = _worktree(git_repo)
    pkg = path / "pkg"
    pkg.mkdir()
    git("init", "-q", "-b", "main", cwd=pkg)
    (pkg / "lib.c").write_text("int work(void) { return 1; }\n")
    git("add", "lib.c", cwd=pkg)
    git("-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "commit", "-q", "-m", "work", cwd=pkg)
    _killed(git_repo, path)  # its salvage holds pkg as a gitlink: the commit id, not the files

    report = clean.clean(git_repo)

    [kept] = [item for item in report.with_action(clean.KEPT) if item.kind == "worktree"]
    assert kept.reason.startswith("holds a nested repository with work of its own (pkg/)"), kept.reason
    assert (pkg / "lib.c").is_file()
    pushed = git_repo.parent / "pkg.git"
    git("clone", "-q", "--bare", str(pkg), str(pushed), cwd=git_repo)
    git("remote", "add", "origin", str(pushed), cwd=pkg)
    git("fetch", "-q", "origin", cwd=pkg)  # its commits pushed: a salvage's commit id finds them again
    assert clean.nested_work(path, ["pkg/"]) == []


def test_a_worktree_a_process_still_runs_in_is_never_removed(git_repo: Path) -> None:
    """A setup's make left by a SIGKILLed fleet (or anything else working there): clean leaves it."""
    path = _worktree(git_repo)
    _killed(git_repo, path, started=False)
    with subprocess.Popen(["sleep", "300"], cwd=path) as make:
        try:
            report = clean.clean(git_repo)
        finally:
            make.kill()
    [kept] = [item for item in report.with_action(clean.KEPT) if item.kind == "worktree"]
    assert kept.reason.startswith(f"a process is still running in it (pid {make.pid})"), kept.reason
    assert path.is_dir()


def test_what_an_interrupted_setup_left_is_the_setups_and_neither_salvaged_nor_held_against_clean(
    git_repo: Path,
) -> None:
    path = _worktree(git_repo)
    (path / "config.log").write_text("configure debris\n")
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        _record_killed(ledger, git_repo, path, started=False)
        salvaging.finalise_run(ledger, None, RUN, root=git_repo)  # the next command finalises the run
        [attempt] = ledger.get_run(RUN)["attempts"]
    assert attempt["salvage_ref"] is None and salvage.salvage_refs(git_repo) == []

    report = clean.clean(git_repo)

    [gone] = [item for item in report.with_action(clean.REMOVED) if item.kind == "worktree"]
    assert gone.reason == "uncommitted files (1) left by its [worktree] setup: no worker ran in it"
