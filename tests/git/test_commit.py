"""commit_paths on real git repositories: exactly the worker's paths, the user's own work untouched."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stellafleet.core.errors import ClaimConflict, GitError, StellaError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import dirty, gitops, index, worktrees
from stellafleet.git.lane import commit_paths
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git must not read the developer's own config: HOME is a fresh directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def init_repo(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "config", "user.name", "Fleet Test", cwd=root)
    sh("git", "config", "user.email", "fleet@example.invalid", cwd=root)
    gitops.ensure_excluded(root, EXCLUDED_DIRS)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    if files:
        sh("git", "add", *files, cwd=root)
        sh("git", "commit", "-qm", "base", cwd=root)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(
        tmp_path / "repo", {f"{n}.txt": f"{n} v1\n" for n in "abcde"} | {"src/lib.py": "x = 1\n"}
    )


def context(root: Path, *, workspace: Path | None = None, isolation: str = "shared", attempt_id: int = 1,
            task_id: str = "writer", branch: str | None = None) -> WorkerContext:  # fmt: skip
    private = root / ".stella" / "private"
    return WorkerContext(
        root=root, workspace=workspace or root, run_id="r-test", task_id=task_id, task_title="Write path",
        attempt_id=attempt_id, prompt="p", isolation=isolation, branch=branch, base_commit="",
        spend_guard_usd=None, pipeline="command", model=None, timeout_s=None,
        result_path=private / "result.json", log_path=private / "log", transcript_path=private / "t.jsonl",
    )  # fmt: skip


def user_state(root: Path) -> dict[str, str]:
    return {
        "status": sh("git", "status", "--porcelain", cwd=root),
        "cached": sh("git", "diff", "--cached", cwd=root),
        "unstaged": sh("git", "diff", cwd=root),
    }


def head(root: Path) -> str:
    return sh("git", "rev-parse", "HEAD", cwd=root).strip()


def changed(root: Path, commit: str = "HEAD") -> list[str]:
    return sh("git", "diff-tree", "--no-commit-id", "--name-status", "-r", commit, cwd=root).splitlines()


def recorded_commits(root: Path) -> list[dict]:
    db = root / ".stella/private/fleet.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = [dict(row) for row in conn.execute("SELECT * FROM commits ORDER BY committed_at_ms")]
    conn.close()
    return rows


def start_run(root: Path) -> None:
    with Ledger.open(root / ".stella/private/fleet.db") as ledger:
        add_run(
            ledger,
            "r-test",
            base_ref="HEAD",
            base_commit=head(root),
            max_concurrency=2,
            argv=[],
            root=str(root),
        )


def test_commits_exactly_the_workers_paths_and_leaves_the_users_work_alone(repo: Path) -> None:
    start_run(repo)
    # The user's own work in progress: staged, staged-then-edited, unstaged, new staged, untracked.
    (repo / "c.txt").write_text("c staged by the user\n")
    (repo / "s.txt").write_text("new staged file\n")
    sh("git", "add", "c.txt", "s.txt", cwd=repo)
    (repo / "c.txt").write_text("c staged by the user, then edited more\n")
    (repo / "d.txt").write_text("d edited, not staged\n")
    (repo / "u.txt").write_text("untracked\n")
    # The worker's changes.
    (repo / "a.txt").write_text("a changed by the worker\n")
    (repo / "src/new.py").write_text("y = 2\n")
    before = user_state(repo)
    before_unstaged_others = sh("git", "diff", "--", ".", ":(exclude)a.txt", cwd=repo)
    old = head(repo)

    sha = commit_paths(context(repo), ["a.txt", "./src/new.py"], "Worker change\n\nWith a body.")

    assert sha == head(repo) and sh("git", "rev-parse", "HEAD~1", cwd=repo).strip() == old
    assert changed(repo) == ["M\ta.txt", "A\tsrc/new.py"]
    assert sh("git", "show", "HEAD:a.txt", cwd=repo) == "a changed by the worker\n"
    assert sh("git", "log", "-1", "--format=%B", cwd=repo).strip() == "Worker change\n\nWith a body."
    after = user_state(repo)
    worker_lines = {" M a.txt", "?? src/new.py"}
    assert after["status"].splitlines() == [
        line for line in before["status"].splitlines() if line not in worker_lines
    ]
    assert after["cached"] == before["cached"]  # the user's staged c.txt and s.txt, byte for byte
    assert after["unstaged"] == before_unstaged_others
    assert "d edited, not staged" in after["unstaged"] and "then edited more" in after["unstaged"]
    assert "a.txt" not in after["status"] and "src/new.py" not in after["status"]
    assert sh("git", "show", ":c.txt", cwd=repo) == "c staged by the user\n"
    [row] = recorded_commits(repo)
    assert (row["sha"], row["task_id"], row["attempt_id"], row["branch"], row["message"]) == (
        sha, "writer", 1, "main", "Worker change",
    )  # fmt: skip
    with ClaimStore.open(repo / ".stella/private/store.db") as store:
        assert {path for path, h in store.claims() if h.attempt_id == 1} == {"a.txt", "src/new.py"}
        assert store.lane_holder() is None


def test_a_deleted_path_is_committed_as_a_deletion(repo: Path) -> None:
    (repo / "b.txt").unlink()
    (repo / "e.txt").write_text("user's unstaged edit\n")
    sha = commit_paths(context(repo), ["b.txt"], "Remove b")
    assert changed(repo, sha) == ["D\tb.txt"]
    assert sh("git", "ls-files", "b.txt", cwd=repo) == ""
    assert sh("git", "status", "--porcelain", cwd=repo).splitlines() == [" M e.txt"]


def test_head_moving_under_the_commit_is_a_clear_error(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_commit_tree = index.commit_tree

    def commit_tree_then_someone_else_commits(root: Path, tree: str, parent: str | None, message: str) -> str:
        made = real_commit_tree(root, tree, parent, message=message)
        # outside the lane and without the index lock (a `git commit` now waits for the lane's commit)
        other = sh("git", "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "someone else", cwd=repo).strip()
        sh("git", "update-ref", "HEAD", other, cwd=repo)
        return made

    (repo / "a.txt").write_text("worker\n")
    monkeypatch.setattr(index, "commit_tree", commit_tree_then_someone_else_commits)
    with pytest.raises(GitError, match=r"HEAD moved while committing .*nothing was committed: try again"):
        commit_paths(context(repo), ["a.txt"], "Worker change")
    assert sh("git", "log", "-1", "--format=%s", cwd=repo).strip() == "someone else"
    assert sh("git", "status", "--porcelain", cwd=repo).splitlines() == [" M a.txt"]  # left for a retry
    assert recorded_commits(repo) == []
    monkeypatch.setattr(index, "commit_tree", real_commit_tree)
    sha = commit_paths(context(repo), ["a.txt"], "Worker change, again")  # the lane was released
    assert changed(repo, sha) == ["M\ta.txt"]


def test_shared_commit_waits_for_the_lane_and_gives_up_naming_the_holder(repo: Path) -> None:
    store_db = repo / ".stella/private/store.db"
    ClaimStore.open(store_db).close()
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from stellafleet.state.claims import ClaimStore, Holder
        store = ClaimStore.open(Path({str(store_db)!r}))
        lane = store.commit_lane(Holder.current("r-test", "reader", "Read path", 2))
        lane.__enter__()
        print("in lane", flush=True)
        time.sleep(120)
    """)
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "in lane"
        (repo / "a.txt").write_text("worker\n")
        old = head(repo)
        with pytest.raises(
            StellaError, match=rf'commit lane is still held by task "reader" .*pid {other.pid}\)'
        ):
            commit_paths(context(repo), ["a.txt"], "Worker change", lane_timeout=0.2)
        assert head(repo) == old
    finally:
        other.kill()
        other.wait()
    # Its holder is gone now: the lane is taken over.
    sha = commit_paths(context(repo), ["a.txt"], "Worker change")
    assert changed(repo, sha) == ["M\ta.txt"]


def test_a_path_another_live_worker_holds_is_refused(repo: Path) -> None:
    with ClaimStore.open(repo / ".stella/private/store.db") as store:
        store.acquire(["a.txt"], Holder.current("r-test", "reader", "Read path", 2))
    (repo / "a.txt").write_text("worker\n")
    old = head(repo)
    with pytest.raises(ClaimConflict, match=r'claim conflict: a\.txt is held by task "reader" \(Read path\)'):
        commit_paths(context(repo), ["a.txt"], "Worker change")
    assert head(repo) == old


def test_isolated_worktree_commits_on_its_branch_without_the_lane(repo: Path) -> None:
    start_run(repo)
    tree = repo / ".stella/worktrees/docs-0123456789abcdef"
    worktrees.worktree_add(repo, tree, "fleet/docs-0123456789abcdef", head(repo))
    main_before = head(repo)
    (tree / "a.txt").write_text("isolated work\n")
    (tree / "b.txt").unlink()
    (repo / "a.txt").write_text("user's own edit in the main tree\n")
    ctx = context(repo, workspace=tree, isolation="isolated", branch="fleet/docs-0123456789abcdef")
    with ClaimStore.open(repo / ".stella/private/store.db") as store:
        lane = store.commit_lane(Holder.current("r-test", "other", "Other", 9))
        with lane:  # someone holds the lane: an isolated commit does not need it
            sha = commit_paths(ctx, ["a.txt", "b.txt"], "Docs")
    assert head(repo) == main_before
    assert sh("git", "rev-parse", "fleet/docs-0123456789abcdef", cwd=repo).strip() == sha
    assert changed(repo, sha) == ["M\ta.txt", "D\tb.txt"]
    assert sh("git", "status", "--porcelain", cwd=tree) == ""
    assert sh("git", "status", "--porcelain", cwd=repo).splitlines() == [" M a.txt"]
    [row] = recorded_commits(repo)
    assert (row["sha"], row["branch"]) == (sha, "fleet/docs-0123456789abcdef")


def test_the_first_commit_of_an_unborn_branch(tmp_path: Path) -> None:
    root = init_repo(tmp_path / "empty", {})
    (root / "README.md").write_text("hello\n")
    sha = commit_paths(context(root), [str(root / "README.md")], "First")
    assert head(root) == sha and changed(root, sha) == []  # a root commit: diff-tree shows nothing
    assert sh("git", "ls-tree", "--name-only", "HEAD", cwd=root).split() == ["README.md"]
    assert sh("git", "status", "--porcelain", cwd=root) == ""


def test_paths_outside_the_workspace_or_not_work_are_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    (repo / "escape").symlink_to(outside)
    ctx = context(repo)
    cases = {
        "../outside/secret.txt": "paths must stay inside the workspace",
        str(outside / "secret.txt"): "outside the workspace",
        "escape/secret.txt": "outside the workspace through a symlink",
        ".git/config": "repository or stella state",
        ".stella/private/fleet.db": "repository or stella state",
        "src": "is a directory",
        "nope.txt": "no such file in the workspace or in HEAD",
    }
    old = head(repo)
    for path, message in cases.items():
        with pytest.raises(StellaError, match=message):
            commit_paths(ctx, [path], "x")
    with pytest.raises(StellaError, match=r"nothing to commit: a\.txt match HEAD already"):
        commit_paths(ctx, ["a.txt"], "x")
    with pytest.raises(StellaError, match="needs a message"):
        commit_paths(ctx, ["a.txt"], "  ")
    with pytest.raises(StellaError, match="name the files"):
        commit_paths(ctx, [], "x")
    assert head(repo) == old


def test_claims_taken_by_a_commit_command_belong_to_the_worker_that_ran_it(
    repo: Path, tmp_path: Path
) -> None:
    """`stella commit` run by a command pipeline exits at once; its claims stay, held by the worker."""
    ctx = context(repo)
    child = "from stellafleet.git.lane import commit_paths; " \
        "from stellafleet.core.workercontext import WorkerContext; " \
        "print(commit_paths(WorkerContext.from_env(), ['a.txt'], 'From a command'))"  # fmt: skip
    worker_code = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {child!r}], check=True)
        print("committed", flush=True)
        sys.stdin.readline()
    """)
    (repo / "a.txt").write_text("from a command\n")
    env = {**os.environ, **ctx.to_env(), "HOME": str(tmp_path / "home")}
    worker = subprocess.Popen(
        [sys.executable, "-c", worker_code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        sha, done = worker.stdout.readline().strip(), worker.stdout.readline().strip()
        assert done == "committed" and sha == head(repo)
        with ClaimStore.open(repo / ".stella/private/store.db") as store:
            held = dict(store.claims()).get("a.txt")
            assert held is not None and held.pid == worker.pid and held.attempt_id == ctx.attempt_id
            with pytest.raises(ClaimConflict, match=rf"pid {worker.pid}\)"):
                store.touch("a.txt", Holder.current("r-test", "other", "Other", 99))
    finally:
        assert worker.stdin is not None
        worker.stdin.write("\n")
        worker.stdin.close()
        assert worker.wait(timeout=30) == 0


def test_a_file_holding_only_the_users_changes_is_not_said_to_match_head(repo: Path) -> None:
    # --allow-dirty: a.txt had the user's change when the run started, and the worker changed nothing more
    (repo / "a.txt").write_text("the user's\n")
    ctx = context(repo)
    dirty.save(repo, ctx.run_id, dirty.take(repo, ["a.txt"]))
    with pytest.raises(StellaError) as refused:
        commit_paths(ctx, ["a.txt"], "x")
    assert str(refused.value) == (
        "nothing to commit: the only changes in a.txt are the uncommitted changes of yours from when the "
        "run started (--allow-dirty keeps those out of the workers' commits)"
    )
