"""git/clean.py's decisions, called in process on real repositories (see test_clean_guards.py): which
record of a task makes a candidate, what a live attempt or a live fleet keeps and says, what --force
discards, and which target a branch counts as merged into."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git
from test_clean_guards import DONE, LIVE_PID, RUNNING, alive, decisions, fleet_worktree, record

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops
from stellafleet.git.clean import KEPT, REMOVED, clean
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task


def started_and_live(pid: int | None, started_ms: int | None) -> bool:
    """Alive only when asked with a start time, as pid_alive needs one to tell a recycled pid."""
    return pid == LIVE_PID and started_ms is not None


def test_a_live_attempt_is_judged_by_its_pid_and_its_start_time(git_repo: Path) -> None:
    """The pid alone is not enough (a recycled pid): alive() is asked with the worker's start time."""
    branch, path = fleet_worktree(git_repo, "running")
    record(git_repo, RUNNING, {"t": (branch, str(path))}, live=True, attempt_pid=LIVE_PID)
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        started = ledger.get_run(RUNNING)["attempts"][0]["pid_started_ms"]
    asked: list[tuple[int | None, int | None]] = []

    def alive_when_started(pid: int | None, started_ms: int | None) -> bool:
        asked.append((pid, started_ms))
        return started_and_live(pid, started_ms)

    report = clean(git_repo, force=True, alive=alive_when_started)
    assert (LIVE_PID, started) in asked
    why = f"attempt 1 is still running (pid {LIVE_PID}); never removed while live"
    assert decisions(report) == {str(path.relative_to(git_repo)): (KEPT, why), branch: (KEPT, why)}
    assert path.is_dir() and gitops.branch_exists(git_repo, branch)


def test_a_live_fleets_task_with_no_open_attempt_is_kept_in_the_runs_name(git_repo: Path) -> None:
    branch, path = fleet_worktree(git_repo, "between")
    record(git_repo, RUNNING, {"t": (branch, str(path))}, live=True, attempt_pid=999_999_998)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        attempt = ledger.get_run(RUNNING)["attempts"][0]["id"]
        ledger.attempts.finish(attempt, AttemptEnd(outcome="failed", exit_code=1, summary="retried"))
    report = clean(git_repo, force=True, alive=started_and_live)  # the fleet too: its pid and start time
    why = f"run {RUNNING} is still running (pid {LIVE_PID}); never removed while live"
    assert decisions(report) == {str(path.relative_to(git_repo)): (KEPT, why), branch: (KEPT, why)}


def test_a_worktree_and_branch_recorded_only_by_an_attempt_with_a_relative_path_are_candidates(
    git_repo: Path,
) -> None:
    """The task row names nothing (an attempt of a resumed run recorded them); the path is relative to the
    repository, wherever stella runs from."""
    branch, path = fleet_worktree(git_repo, "attempt-only")
    relative = str(path.relative_to(git_repo))
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, DONE, root=str(git_repo), base_commit=gitops.head_commit(git_repo), pid=1)
        ledger.tasks.add(DONE, [sample_task("t", isolation="isolated")], {"t": 1})
        attempt = ledger.attempts.start(DONE, "t", pipeline="command", branch=branch, worktree=relative)
        ledger.attempts.set_pid(attempt, 999_999_998)
        ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="done"))
        ledger.runs.finish(DONE, "succeeded", exit_code=0)
    report = clean(git_repo, alive=alive)
    sha = gitops.head_commit(git_repo)[:7]
    assert decisions(report) == {
        relative: (REMOVED, "clean worktree"),
        branch: (REMOVED, f"merged into main (was {sha})"),
    }
    assert not path.exists() and not gitops.branch_exists(git_repo, branch)


def test_force_discards_a_started_workers_uncommitted_changes_and_says_how_many(git_repo: Path) -> None:
    branch, path = fleet_worktree(git_repo, "forced")
    (path / "README.md").write_text("changed\n")
    (path / "new.txt").write_text("new\n")
    record(git_repo, DONE, {"t": (branch, str(path))})
    report = clean(git_repo, force=True, alive=alive)
    shown = str(path.relative_to(git_repo))
    assert decisions(report)[shown] == (REMOVED, "uncommitted changes (2) discarded by --force")
    assert not path.exists()
    assert decisions(report)[branch][0] == REMOVED  # its worktree gone, the merged branch goes too


def test_a_branch_merged_into_the_runs_base_but_not_the_current_branch_is_merged(git_repo: Path) -> None:
    git("checkout", "-q", "-b", "release", cwd=git_repo)
    (git_repo / "release.txt").write_text("release\n")
    git("add", "release.txt", cwd=git_repo)
    git("commit", "-q", "-m", "release work", cwd=git_repo)
    release = gitops.head_commit(git_repo)
    git("branch", "fleet/on-release", release, cwd=git_repo)
    git("checkout", "-q", "main", cwd=git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, DONE, root=str(git_repo), base_ref="release", base_commit=release, pid=1)
        ledger.tasks.add(DONE, [sample_task("t", isolation="isolated")], {"t": 1})
        ledger.tasks.set_workspace(DONE, "t", "fleet/on-release", None)
        ledger.runs.finish(DONE, "succeeded", exit_code=0)
    report = clean(git_repo, alive=alive)
    assert decisions(report) == {"fleet/on-release": (REMOVED, f"merged into release (was {release[:7]})")}


def fleet_branch(repo: Path, name: str, commits: int) -> tuple[str, str]:
    """fleet/<name> with `commits` commits of its own beyond main (main checked out again); its tip."""
    git("checkout", "-q", "-b", f"fleet/{name}", cwd=repo)
    for number in range(commits):
        (repo / f"{name}-{number}.txt").write_text(f"{name} {number}\n")
        git("add", ".", cwd=repo)
        git("commit", "-q", "-m", f"{name} {number}", cwd=repo)
    tip = gitops.head_commit(repo)
    git("checkout", "-q", "main", cwd=repo)
    return f"fleet/{name}", tip


def test_each_branch_decision_says_why_and_the_report_lists_them(git_repo: Path) -> None:
    patched, patched_tip = fleet_branch(git_repo, "patched", 1)
    (git_repo / "main.txt").write_text("main moved on\n")
    git("add", "main.txt", cwd=git_repo)
    git("commit", "-q", "-m", "main moves on", cwd=git_repo)
    git("cherry-pick", patched_tip, cwd=git_repo)  # on main as the same patch, another commit
    held, held_tip = fleet_branch(git_repo, "held", 1)
    git("branch", "mine", held_tip, cwd=git_repo)  # the user's branch holds its commit
    ahead, _ = fleet_branch(git_repo, "ahead", 2)
    single, single_tip = fleet_branch(git_repo, "single", 1)
    record(git_repo, DONE, {t: (b, None) for t, b in [("p", patched), ("h", held), ("a", ahead)]})
    report = clean(git_repo, alive=alive)
    assert decisions(report) == {
        patched: (REMOVED, f"merged into main (same changes) (was {patched_tip[:7]})"),
        held: (REMOVED, f"every commit is on another branch or a salvage ref (was {held_tip[:7]})"),
        ahead: (KEPT, "not merged into main (2 commits ahead): merge it, or rerun with --force to delete it"),
    }
    assert report.runs_considered == 1
    document = report.to_json()
    assert (document["dry_run"], document["force"], document["runs_considered"]) == (False, False, 1)
    assert [item["target"] for item in document["removed"]] == [patched, held]
    assert [(item["target"], item["task_id"]) for item in document["kept"]] == [(ahead, "a")]
    assert document["would_remove"] == []
    # forced, and only the run named: the other run's branch is not even looked at
    record(git_repo, RUNNING, {"s": (single, None)})
    forced = clean(git_repo, force=True, alive=alive, run_ref=RUNNING)
    assert decisions(forced) == {
        single: (REMOVED, f"not merged (1 commit ahead), deleted by --force (was {single_tip[:7]})")
    }
    assert gitops.branch_exists(git_repo, ahead)
    dry = clean(git_repo, dry_run=True, force=True, alive=alive).to_json()
    assert (dry["dry_run"], dry["force"], [item["target"] for item in dry["would_remove"]]) == (
        True,
        True,
        [ahead],
    )


def test_teardown_runs_in_the_worktree_with_its_tasks_variables_and_its_failure_is_named(
    git_repo: Path, tmp_path: Path
) -> None:
    said = tmp_path / "teardown.txt"
    command = (
        f'echo "$STELLA_RUN_ID $STELLA_TASK_ID $STELLA_BRANCH $PWD" >> {said}; test "$STELLA_TASK_ID" = ok'
    )
    ok_branch, ok_path = fleet_worktree(git_repo, "ok")
    bad_branch, bad_path = fleet_worktree(git_repo, "bad")
    record(git_repo, DONE, {"ok": (ok_branch, str(ok_path)), "bad": (bad_branch, str(bad_path))})
    report = clean(git_repo, alive=alive, worktree=WorktreeConfig(teardown=command, teardown_timeout=60.0))
    found = decisions(report)
    assert found[str(ok_path.relative_to(git_repo))] == (REMOVED, "clean worktree; teardown ran")
    action, why = found[str(bad_path.relative_to(git_repo))]
    assert action == REMOVED and why.startswith("clean worktree; teardown failed (exit 1 after "), why
    assert why.endswith(" s), removed anyway")
    assert sorted(said.read_text().splitlines()) == sorted(
        [f"{DONE} ok {ok_branch} {ok_path.resolve()}", f"{DONE} bad {bad_branch} {bad_path.resolve()}"]
    )
    log = StatePaths(git_repo).log_file(DONE, "ok")
    assert log.is_file() and not ok_path.exists() and not bad_path.exists()
    # a dry run runs no teardown
    again_branch, again = fleet_worktree(git_repo, "again")
    record(git_repo, RUNNING, {"ok": (again_branch, str(again))})
    clean(git_repo, alive=alive, dry_run=True, worktree=WorktreeConfig(teardown=command))
    assert len(said.read_text().splitlines()) == 2


def test_salvage_of_commits_no_branch_holds_is_kept_unless_forced_and_never_when_younger(
    git_repo: Path,
) -> None:
    record(git_repo, DONE, {"t": (None, None)})
    git("checkout", "-q", "--detach", cwd=git_repo)
    (git_repo / "lost.txt").write_text("only the salvage holds this\n")
    git("add", "lost.txt", cwd=git_repo)
    git("commit", "-q", "-m", "work of a deleted branch", cwd=git_repo)
    git("commit", "-q", "--allow-empty", "-m", "the salvage commit", cwd=git_repo)
    sha = gitops.head_commit(git_repo)
    git("checkout", "-q", "main", cwd=git_repo)
    ref = f"refs/stella/salvage/{DONE}/t/1"
    git("update-ref", ref, sha, cwd=git_repo)
    assert decisions(clean(git_repo, alive=alive, salvage_refs=True, older_than_days=1.0)) == {}
    kept = clean(git_repo, alive=alive, salvage_refs=True)
    why = f"holds 1 commit no branch holds: `git branch NAME {sha[:12]}^` keeps them, or rerun with --force"
    assert decisions(kept) == {ref: (KEPT, why)}
    assert [(item.run_id, item.task_id) for item in kept.items] == [(DONE, "t")]
    forced = clean(git_repo, alive=alive, salvage_refs=True, force=True)
    removed = f"salvage of attempt 1 removed by --salvage (was {sha[:7]})"
    removed += ", with 1 commit no branch holds, by --force"
    assert decisions(forced) == {ref: (REMOVED, removed)}
    assert gitops.ref_commit(git_repo, ref) is None
