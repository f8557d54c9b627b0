"""`stella clean` on real repositories: what goes, what stays and why, and what the ledger records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.repo import run_stella

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.git import gitops, worktrees
from stellafleet.proc.pids import pid_alive
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task


def stella(repo: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return run_stella(*args, cwd=repo, env={"HOME": str(home), "NO_COLOR": "1"}, timeout=60)


def commit_file(where: Path, name: str, text: str, message: str) -> str:
    (where / name).write_text(text)
    gitops.git("add", name, cwd=where)
    gitops.git("commit", "-q", "-m", message, cwd=where)
    return gitops.head_commit(where)


@dataclass
class Workspace:
    task_id: str
    branch: str
    worktree: Path


@dataclass
class Scene:
    repo: Path
    home: Path
    finished_run: str
    live_run: str
    spaces: dict[str, Workspace]
    sleeper: subprocess.Popen[bytes]

    def branches(self) -> set[str]:
        return set(gitops.git("branch", "--list", "*", "--format=%(refname:short)", cwd=self.repo).split())

    def worktrees(self) -> set[Path]:
        return {wt.path.resolve() for wt in worktrees.worktree_list(self.repo)}

    def cleanups(self) -> list[dict[str, object]]:
        with Ledger.open(StatePaths(self.repo).fleet_db, readonly=True) as ledger:
            return [c for run in (self.finished_run, self.live_run) for c in ledger.get_run(run)["cleanups"]]


def _isolated(repo: Path, run_id: str, task_id: str) -> Workspace:
    name = worktrees.isolated_name(run_id, task_id)
    path = StatePaths(repo).worktrees / name
    worktrees.worktree_add(repo, path, f"fleet/{name}", gitops.head_commit(repo))
    return Workspace(task_id, f"fleet/{name}", path)


@pytest.fixture
def scene(tmp_path: Path, isolated_home: Path) -> Iterator[Scene]:
    """A repository after two fleets: one finished (merged, unmerged, dirty work), one whose worker lives."""
    repo = tmp_path / "repo"
    home = isolated_home
    repo.mkdir()
    gitops.git("init", "-q", "-b", "main", cwd=repo)
    gitops.git("config", "user.email", "dev@example.invalid", cwd=repo)
    gitops.git("config", "user.name", "Dev", cwd=repo)
    commit_file(repo, "README.md", "hello\n", "initial")
    gitops.ensure_excluded(repo, [".stella/"])
    gitops.git("branch", "feature/mine", cwd=repo)  # the user's own branches are never candidates
    gitops.git("branch", "fleet/hand-made", cwd=repo)

    finished, live = "r-20261130-090000-aaaa", "r-20261130-100000-bbbb"
    spaces = {task: _isolated(repo, finished, task) for task in ("merged", "unmerged", "dirty")}
    spaces["live"] = _isolated(repo, live, "live")
    commit_file(spaces["merged"].worktree, "merged.txt", "merged work\n", "merged work")
    gitops.git("merge", "-q", "--no-ff", "-m", "merge fleet work", spaces["merged"].branch, cwd=repo)
    commit_file(spaces["unmerged"].worktree, "unmerged.txt", "unmerged work\n", "unmerged work")
    (spaces["dirty"].worktree / "notes.txt").write_text("not committed yet\n")
    commit_file(spaces["live"].worktree, "live.txt", "in progress\n", "in progress")

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    db = StatePaths(repo).fleet_db
    with Ledger.open(db) as ledger:
        for run_id, tasks, status in (
            (finished, ("merged", "unmerged", "dirty"), "succeeded"),
            (live, ("live",), "interrupted"),
        ):
            add_run(
                ledger,
                run_id,
                base_commit=gitops.head_commit(repo),
                max_concurrency=3,
                argv=["fleet"],
                root=str(repo),
                pid=999_999_999,
            )
            ledger.tasks.add(
                run_id,
                [sample_task(t, f"do {t}", isolation="isolated") for t in tasks],
                dict.fromkeys(tasks, 1),
            )
            for task in tasks:
                ws = spaces[task]
                # the fleet may record absolute or repository-relative worktree paths: accept both
                recorded = str(ws.worktree) if task != "unmerged" else str(ws.worktree.relative_to(repo))
                ledger.tasks.set_workspace(run_id, task, ws.branch, recorded)
                attempt = ledger.attempts.start(
                    run_id, task, pipeline="command", branch=ws.branch, worktree=recorded
                )
                if task == "live":
                    # the fleet died, but its worker is still at work: its things must survive any clean
                    ledger.attempts.set_pid(attempt, sleeper.pid)
                    continue
                ledger.attempts.set_pid(attempt, 999_999_998)
                ledger.attempts.finish(
                    attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary=f"{task} done")
                )
                ledger.tasks.set_status(run_id, task, "succeeded")
            ledger.runs.finish(run_id, status, exit_code=0 if status == "succeeded" else 130)
        shared_only = "r-20261130-080000-0000"  # a run of shared tasks leaves nothing to clean
        add_run(
            ledger,
            shared_only,
            base_commit=gitops.head_commit(repo),
            argv=["fleet"],
            root=str(repo),
            pid=999_999_997,
        )
        ledger.tasks.add(shared_only, [sample_task("t1", "shared work")], {"t1": 1})
        ledger.runs.finish(shared_only, "succeeded", exit_code=0)
    try:
        yield Scene(repo, home, finished, live, spaces, sleeper)
    finally:
        sleeper.kill()
        sleeper.wait()


def _by_target(items: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {item["target"]: item for item in items}


def _rel(scene: Scene, task: str) -> str:
    return str(scene.spaces[task].worktree.relative_to(scene.repo))


def test_dry_run_lists_what_would_go_and_changes_nothing(scene: Scene) -> None:
    branches, worktrees = scene.branches(), scene.worktrees()
    result = stella(scene.repo, "clean", "--dry-run", "--json", home=scene.home)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dry_run"] is True and report["removed"] == []
    assert report["runs_considered"] == 2  # the runs that recorded a branch or worktree
    would = _by_target(report["would_remove"])
    assert set(would) == {
        _rel(scene, "merged"),
        scene.spaces["merged"].branch,
        _rel(scene, "unmerged"),
    }
    kept = _by_target(report["kept"])
    assert "not merged into main" in kept[scene.spaces["unmerged"].branch]["reason"]
    assert scene.branches() == branches
    assert scene.worktrees() == worktrees
    assert scene.cleanups() == []

    text = stella(scene.repo, "clean", "--dry-run", home=scene.home)
    assert f"would remove branch   {scene.spaces['merged'].branch}" in text.stdout
    assert "dry run: nothing was changed" in text.stdout
    assert scene.branches() == branches


def test_clean_removes_merged_and_keeps_unmerged_dirty_and_live_by_name(scene: Scene) -> None:
    result = stella(scene.repo, "clean", home=scene.home)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    s = scene.spaces

    # merged and finished: gone, worktree and branch
    assert not s["merged"].worktree.exists()
    assert s["merged"].branch not in scene.branches()
    # unmerged: its clean worktree goes (the commits live on the branch), the branch stays, named
    assert not s["unmerged"].worktree.exists()
    assert s["unmerged"].branch in scene.branches()
    assert (
        f"kept         branch   {s['unmerged'].branch}" in out
        and "not merged into main (1 commit ahead)" in out
    )
    # uncommitted changes: worktree and its checked-out branch stay, named
    assert (s["dirty"].worktree / "notes.txt").read_text() == "not committed yet\n"
    assert s["dirty"].branch in scene.branches()
    assert f"kept         worktree {_rel(scene, 'dirty')}" in out
    assert "uncommitted changes (1 file: notes.txt)" in out
    # a live attempt: untouched
    assert s["live"].worktree.exists() and s["live"].branch in scene.branches()
    assert f"still running (pid {scene.sleeper.pid})" in out
    # never the user's own branches, even one named like ours
    assert {"main", "feature/mine", "fleet/hand-made"} <= scene.branches()

    recorded = {(c["kind"], c["target"], c["action"]) for c in scene.cleanups()}
    assert ("branch", s["merged"].branch, "removed") in recorded
    assert ("worktree", _rel(scene, "merged"), "removed") in recorded
    assert ("branch", s["unmerged"].branch, "kept") in recorded
    assert ("worktree", _rel(scene, "dirty"), "kept") in recorded
    assert ("worktree", _rel(scene, "live"), "kept") in recorded

    again = stella(scene.repo, "clean", "--json", home=scene.home)
    report = json.loads(again.stdout)
    assert report["removed"] == []  # nothing removed twice; what stays is named again
    assert {i["target"] for i in report["kept"]} == {
        s["unmerged"].branch,
        _rel(scene, "dirty"),
        s["dirty"].branch,
        _rel(scene, "live"),
        s["live"].branch,
    }


def test_force_removes_unmerged_and_dirty_but_never_a_live_attempt(scene: Scene) -> None:
    result = stella(scene.repo, "clean", "--force", "--json", home=scene.home)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    s = scene.spaces
    removed = _by_target(report["removed"])
    assert "deleted by --force" in removed[s["unmerged"].branch]["reason"]
    assert "discarded by --force" in removed[_rel(scene, "dirty")]["reason"]
    assert s["unmerged"].branch not in scene.branches()
    assert not s["dirty"].worktree.exists() and s["dirty"].branch not in scene.branches()
    kept = _by_target(report["kept"])
    assert set(kept) == {_rel(scene, "live"), s["live"].branch}
    assert s["live"].worktree.exists() and s["live"].branch in scene.branches()
    assert scene.sleeper.poll() is None
    assert {"main", "feature/mine", "fleet/hand-made"} <= scene.branches()


def test_once_the_worker_exits_its_leftovers_can_go(scene: Scene) -> None:
    scene.sleeper.kill()
    scene.sleeper.wait()
    result = stella(scene.repo, "clean", "--run", scene.live_run[:15], "--force", "--json", home=scene.home)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["runs_considered"] == 1
    assert set(_by_target(report["removed"])) == {_rel(scene, "live"), scene.spaces["live"].branch}
    assert scene.spaces["merged"].branch in scene.branches()  # --run limits the sweep to that run


def test_a_running_fleet_is_left_alone(tmp_path: Path, isolated_home: Path) -> None:
    # HOME isolated and the identity set here: the commits never depend on the user's own git config
    repo = tmp_path / "repo"
    repo.mkdir()
    gitops.git("init", "-q", "-b", "main", cwd=repo)
    gitops.git("config", "user.email", "dev@example.invalid", cwd=repo)
    gitops.git("config", "user.name", "Dev", cwd=repo)
    commit_file(repo, "a.txt", "a\n", "initial")
    ws = _isolated(repo, "r-20261130-110000-cccc", "t1")
    with Ledger.open(StatePaths(repo).fleet_db) as ledger:
        add_run(
            ledger,
            "r-20261130-110000-cccc",
            base_commit=gitops.head_commit(repo),
            argv=["fleet"],
            root=str(repo),
        )
        ledger.tasks.add("r-20261130-110000-cccc", [sample_task("t1", "x", isolation="isolated")], {"t1": 1})
        ledger.tasks.set_workspace("r-20261130-110000-cccc", "t1", ws.branch, str(ws.worktree))
    result = stella(repo, "clean", "--force", "--json", home=isolated_home)
    report = json.loads(result.stdout)
    assert report["removed"] == []
    assert {i["target"] for i in report["kept"]} == {ws.branch, str(ws.worktree.relative_to(repo))}
    assert all(f"still running (pid {os.getpid()})" in i["reason"] for i in report["kept"])
    assert ws.worktree.exists()


def test_nothing_to_clean_without_a_ledger(tmp_path: Path, isolated_home: Path) -> None:
    gitops.git("init", "-q", "-b", "main", cwd=tmp_path)
    result = stella(tmp_path, "clean", home=isolated_home)
    assert result.returncode == 0
    assert result.stdout.startswith("Nothing to clean")
    assert not StatePaths(tmp_path).fleet_db.exists()  # a clean never creates a ledger


def test_unknown_run_is_one_clear_line(scene: Scene) -> None:
    result = stella(scene.repo, "clean", "--run", "r-1999", home=scene.home)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "stella: error: no run matches 'r-1999': `stella runs` lists the recorded runs"
    ]


def test_pid_alive_checks_the_process_creation_time() -> None:
    now_ms = int(time.time() * 1000)
    assert pid_alive(os.getpid(), now_ms)
    assert pid_alive(os.getpid(), None)
    # this process was created long after an attempt that started at the epoch: a recycled pid
    assert not pid_alive(os.getpid(), 0)
    assert not pid_alive(None, now_ms)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not pid_alive(dead.pid, now_ms)
