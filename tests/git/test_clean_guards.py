"""git/clean.py's guards, called in process on real repositories: what `stella clean` must never remove,
whatever the ledger says (a ledger can name any path and any branch: a hand edit, a bug, an old version)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops, worktrees
from stellafleet.git.clean import KEPT, REMOVED, WOULD_REMOVE, CleanReport, clean
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

LIVE_PID = 4242  # the one pid these tests call alive (injected: no process is needed)
DONE, RUNNING = "r-20261201-090000-aaaa", "r-20261201-100000-bbbb"


def alive(pid: int | None, started_ms: int | None) -> bool:
    return pid == LIVE_PID


def fleet_worktree(repo: Path, name: str, where: Path | None = None) -> tuple[str, Path]:
    """A worktree on branch fleet/<name> at HEAD: under .stella/worktrees/ unless `where` says otherwise."""
    path = where or StatePaths(repo).worktrees / name
    worktrees.worktree_add(repo, path, f"fleet/{name}", gitops.head_commit(repo))
    return f"fleet/{name}", path


def record(
    repo: Path,
    run_id: str,
    spaces: dict[str, tuple[str | None, str | None]],
    *,
    live: bool = False,
    attempt_pid: int | None = 999_999_998,
) -> None:
    """A run whose tasks recorded these (branch, worktree) pairs; finished unless live (its fleet's pid then
    alive and each attempt still open, with attempt_pid)."""
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        add_run(
            ledger, run_id, root=str(repo), base_commit=gitops.head_commit(repo), pid=LIVE_PID if live else 1
        )
        ledger.tasks.add(
            run_id, [sample_task(t, isolation="isolated") for t in spaces], dict.fromkeys(spaces, 1)
        )
        for task, (branch, worktree) in spaces.items():
            ledger.tasks.set_workspace(run_id, task, branch, worktree)
            attempt = ledger.attempts.start(
                run_id, task, pipeline="command", branch=branch, worktree=worktree
            )
            if attempt_pid is not None:
                ledger.attempts.set_pid(attempt, attempt_pid)
            if not live:
                ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="done"))
        if not live:
            ledger.runs.finish(run_id, "succeeded", exit_code=0)


def decisions(report: CleanReport) -> dict[str, tuple[str, str]]:
    return {item.target: (item.action, item.reason) for item in report.items}


def test_a_worktree_outside_stellas_directory_is_never_removed(git_repo: Path, tmp_path: Path) -> None:
    """Recorded paths outside .stella/worktrees/: a linked worktree elsewhere, the main tree itself, and a
    path that only looks inside (`..`); none is removed, none is even named."""
    elsewhere_branch, elsewhere = fleet_worktree(git_repo, "elsewhere", tmp_path / "elsewhere")
    escape = StatePaths(git_repo).worktrees / ".." / ".." / ".." / "elsewhere"
    inside_branch, inside = fleet_worktree(git_repo, "inside")
    spaces = {
        "out": (None, str(elsewhere)),
        "escape": (None, str(escape)),
        "main": (None, str(git_repo)),
        "relative-main": (None, "."),
        "in": (inside_branch, str(inside)),
    }
    record(git_repo, DONE, spaces)
    report = clean(git_repo, force=True, alive=alive)
    assert elsewhere.is_dir() and (git_repo / "README.md").exists()
    assert {tree.path.resolve() for tree in worktrees.worktree_list(git_repo)} == {
        git_repo.resolve(),
        elsewhere.resolve(),
    }
    assert gitops.branch_exists(git_repo, elsewhere_branch)  # never recorded: not a candidate
    assert decisions(report) == {
        str(inside.relative_to(git_repo)): (REMOVED, "clean worktree"),
        inside_branch: (REMOVED, f"merged into main (was {gitops.head_commit(git_repo)[:7]})"),
    }


def test_a_branch_outside_fleet_is_never_deleted(git_repo: Path) -> None:
    """Merged, recorded, checked out nowhere: a branch not named fleet/... stays all the same."""
    for branch in ("feature/mine", "fleetwork", "main-fleet/x", "fleet/ours"):
        git("branch", branch, cwd=git_repo)
    record(
        git_repo,
        DONE,
        {
            t: (b, None)
            for t, b in [
                ("a", "feature/mine"),
                ("b", "fleetwork"),
                ("c", "main-fleet/x"),
                ("d", "fleet/ours"),
            ]
        },
    )
    report = clean(git_repo, force=True, alive=alive)
    assert all(gitops.branch_exists(git_repo, b) for b in ("feature/mine", "fleetwork", "main-fleet/x"))
    assert not gitops.branch_exists(git_repo, "fleet/ours")
    assert set(decisions(report)) == {"fleet/ours"}


def salvage_ref(repo: Path, run_id: str, task: str, attempt: int) -> str:
    ref = f"refs/stella/salvage/{run_id}/{task}/{attempt}"
    git("update-ref", ref, "HEAD", cwd=repo)
    return ref


def test_salvage_keeps_the_salvage_refs_of_a_live_run(git_repo: Path) -> None:
    record(git_repo, DONE, {"t": (None, None)})
    record(git_repo, RUNNING, {"t": (None, None)}, live=True)
    done_ref, live_ref = salvage_ref(git_repo, DONE, "t", 1), salvage_ref(git_repo, RUNNING, "t", 2)
    report = clean(git_repo, force=True, alive=alive, salvage_refs=True)
    assert gitops.ref_commit(git_repo, live_ref) is not None
    assert gitops.ref_commit(git_repo, done_ref) is None
    sha = gitops.head_commit(git_repo)[:7]
    assert decisions(report) == {
        done_ref: (REMOVED, f"salvage of attempt 1 removed by --salvage (was {sha})"),
        live_ref: (KEPT, f"run {RUNNING} is still running"),
    }
    again = clean(git_repo, force=True, alive=alive, salvage_refs=True, run_ref=RUNNING)
    assert decisions(again) == {live_ref: (KEPT, f"run {RUNNING} is still running")}
    assert gitops.ref_commit(git_repo, live_ref) is not None


def test_without_salvage_no_salvage_ref_goes(git_repo: Path) -> None:
    record(git_repo, DONE, {"t": (None, None)})
    ref = salvage_ref(git_repo, DONE, "t", 1)
    assert decisions(clean(git_repo, force=True, alive=alive)) == {}
    assert gitops.ref_commit(git_repo, ref) is not None


def test_a_directory_under_stellas_worktrees_that_git_does_not_know_is_left_alone(git_repo: Path) -> None:
    stray = StatePaths(git_repo).worktrees / "stray"
    stray.mkdir(parents=True)
    (stray / "work.txt").write_text("someone's\n")
    gone = (
        StatePaths(git_repo).worktrees / "gone"
    )  # recorded, never made (or removed by hand): nothing to say
    record(git_repo, DONE, {"a": (None, str(stray)), "b": (None, str(gone))})
    report = clean(git_repo, force=True, alive=alive)
    assert (stray / "work.txt").read_text() == "someone's\n"
    assert decisions(report) == {
        str(stray.relative_to(git_repo)): (KEPT, "not a registered git worktree: remove it by hand")
    }


def test_an_attempt_starting_in_a_live_fleet_is_never_removed(git_repo: Path) -> None:
    """An attempt with no pid yet (its worker is being started) while its fleet lives: kept, even forced."""
    branch, path = fleet_worktree(git_repo, "starting")
    record(git_repo, RUNNING, {"t": (branch, str(path))}, live=True, attempt_pid=None)
    report = clean(git_repo, force=True, alive=alive)
    assert path.is_dir() and gitops.branch_exists(git_repo, branch)
    why = f"attempt 1 is starting (fleet pid {LIVE_PID}); never removed while live"
    assert decisions(report) == {str(path.relative_to(git_repo)): (KEPT, why), branch: (KEPT, why)}


def test_a_worktree_a_live_run_shares_with_a_finished_one_stays(git_repo: Path) -> None:
    """Two runs recorded the same worktree and branch (a resume): the finished run's record, read first,
    must not make it removable while the live one's attempt runs."""
    branch, path = fleet_worktree(git_repo, "shared")
    record(git_repo, DONE, {"t": (branch, str(path))})
    record(git_repo, RUNNING, {"t": (branch, str(path))}, live=True, attempt_pid=LIVE_PID)
    report = clean(git_repo, force=True, alive=alive)
    assert path.is_dir() and gitops.branch_exists(git_repo, branch)
    assert {action for action, _ in decisions(report).values()} == {KEPT}
    assert all(f"(pid {LIVE_PID}); never removed while live" in why for _, why in decisions(report).values())


def test_a_worktree_git_refuses_to_remove_is_reported_kept(git_repo: Path) -> None:
    branch, path = fleet_worktree(git_repo, "locked")
    git("worktree", "lock", str(path), cwd=git_repo)
    record(git_repo, DONE, {"t": (branch, str(path))})
    report = clean(git_repo, alive=alive)
    shown = str(path.relative_to(git_repo))
    action, why = decisions(report)[shown]
    assert (action, why.startswith("git refused: ")) == (KEPT, True)
    assert path.is_dir()
    assert decisions(report)[branch] == (KEPT, f"checked out in {shown}")  # its worktree is still there


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_dry_run_changes_and_records_nothing(git_repo: Path, dry_run: bool) -> None:
    branch, path = fleet_worktree(git_repo, "merged")
    record(git_repo, DONE, {"t": (branch, str(path))})
    report = clean(git_repo, dry_run=dry_run, alive=alive)
    assert {action for action, _ in decisions(report).values()} == {WOULD_REMOVE if dry_run else REMOVED}
    assert path.is_dir() is dry_run and gitops.branch_exists(git_repo, branch) is dry_run
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        assert len(ledger.get_run(DONE)["cleanups"]) == (0 if dry_run else 2)


def dirty_files(count: int) -> Callable[[Path], None]:
    def write(tree: Path) -> None:
        for number in range(count):
            (tree / f"f{number}.txt").write_text("new\n")

    return write


@pytest.mark.parametrize(
    ("count", "named"),
    [
        (1, "1 file: f0.txt"),
        (3, "3 files: f0.txt, f1.txt, f2.txt"),
        (4, "4 files: f0.txt, f1.txt, f2.txt, ..."),
    ],
)
def test_a_dirty_worktree_names_at_most_three_of_its_files(git_repo: Path, count: int, named: str) -> None:
    branch, path = fleet_worktree(git_repo, "dirty")
    dirty_files(count)(path)
    record(git_repo, DONE, {"t": (branch, str(path))})
    report = clean(git_repo, alive=alive)
    why = f"has uncommitted changes ({named}): commit or discard them, or rerun with --force"
    assert decisions(report)[str(path.relative_to(git_repo))] == (KEPT, why)
