"""The git guard (git/guard.py): what it refuses and passes, the real script on a worker's PATH, its line in
the task's log, and stella's own git skipping it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.engine.tools import Toolbox, Workspace
from stellafleet.git import gitops, guard
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptState, RunSettings
from stellafleet.run.steps.gitguard import GitGuard
from stellafleet.state.claims import ClaimStore, Holder

REFUSED = [
    "stash", "stash list", "stash -u", "commit -am x", "add a.txt", "rm a.txt", "mv a.txt z.txt", "clean -fd",
    "switch -c x", "checkout main", "checkout -b x", "rebase main", "merge main", "pull", "cherry-pick HEAD",
    "revert HEAD", "reset --hard", "reset --merge", "reset --keep HEAD", "reset", "reset HEAD~1",
    "checkout -- .", "checkout .", "restore .", "checkout -- b.txt", "restore b.txt", "reset -- b.txt",
    "checkout HEAD -- b.txt", "-C . stash", "-c core.x=y commit -m x",
]  # fmt: skip
PASSED = [
    "status", "log --oneline", "diff", "show HEAD", "checkout", "checkout -- a.txt", "checkout HEAD -- a.txt",
    "restore a.txt", "restore --staged a.txt", "reset -- a.txt", "reset HEAD a.txt", "branch", "blame a.txt",
]  # fmt: skip


@pytest.fixture
def repo(git_repo: Path) -> Path:
    for name in ("a.txt", "b.txt"):
        (git_repo / name).write_text(f"{name}\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    return git_repo


def test_what_would_touch_other_workers_files_or_move_head_is_refused(repo: Path) -> None:
    said = {command: guard.refusal(command.split(), repo, ["a.txt"], repo) for command in REFUSED}
    passed = [
        command for command, why in said.items() if why is None or "is refused in the shared tree" not in why
    ]
    assert passed == []
    assert [command for command, why in said.items() if "stella commit -m MSG PATH" not in str(why)] == []


def test_reads_and_the_tasks_own_claimed_paths_pass(repo: Path) -> None:
    refused = {
        command: why for command in PASSED if (why := guard.refusal(command.split(), repo, ["a.txt"], repo))
    }
    assert refused == {}


def test_a_path_is_the_tasks_from_a_subdirectory_too(repo: Path) -> None:
    (repo / "src").mkdir()
    assert guard.refusal(["checkout", "--", "x.py"], repo / "src", ["src/x.py"], repo) is None
    assert guard.refusal(["checkout", "--", "../b.txt"], repo / "src", ["src/x.py"], repo) is not None


def test_the_script_on_a_workers_path_refuses_in_one_line_to_the_log_and_runs_the_rest(repo: Path) -> None:
    ctx = make_attempt(repo)
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(["a.txt"], Holder.current(ctx.run_id, ctx.task_id, "", ctx.attempt_id))
    folder = guard.install(ctx.paths.private / "gitguard")
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, folder)
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    (repo / "a.txt").write_text("mine\n")
    (repo / "b.txt").write_text("another worker's\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)

    stash = run("stash", "-u")
    assert stash.returncode == 1
    assert stash.stderr == (
        "stella: git stash is refused in the shared tree (other workers' edits live here): "
        "use stella commit -m MSG PATH...\n"
    )
    assert ctx.log_path.read_text() == stash.stderr
    assert run("checkout", "--", ".").returncode == 1
    assert (repo / "b.txt").read_text() == "another worker's\n"
    assert run("checkout", "--", "a.txt").returncode == 0  # its own claimed file
    assert (repo / "a.txt").read_text() == "a.txt\n"
    assert run("status", "--porcelain", "b.txt").stdout == " M b.txt\n"
    assert git("stash", "list", cwd=repo) == ""


def test_stellas_own_git_and_its_hooks_skip_the_guard(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = guard.install(repo.parent / "gitguard")
    for name, value in guard.guarded_env(os.environ, folder).items():
        monkeypatch.setenv(name, value)
    assert str(folder) not in gitops.unguarded(os.environ)["PATH"].split(os.pathsep)
    assert gitops.git("stash", "list", cwd=repo) == ""  # the real git: the guard would refuse it


@pytest.mark.parametrize(("enabled", "isolated"), [(True, False), (False, False), (True, True)])
def test_only_shared_workers_get_it_unless_the_config_turns_it_off(
    repo: Path, enabled: bool, isolated: bool
) -> None:
    config = Config({"fleet": {"git_guard": enabled}})
    settings = RunSettings(repo, "r-1", "0" * 40, "command", config=config)
    ctx = make_attempt(repo)
    if isolated:
        ctx = dataclasses.replace(ctx, isolation="isolated", branch="fleet/t1")
    attempt = AttemptState(PlanTask("t1", "p", "a task"), threading.Event(), context=ctx)
    attempt.env = {"PATH": "/usr/bin"}
    GitGuard(settings).before_start(attempt)
    guarded = attempt.env["PATH"].split(os.pathsep)[0] == str(settings.paths.private / "gitguard")
    assert guarded == (enabled and not isolated)


def test_the_engines_shell_tool_runs_the_guard(repo: Path) -> None:
    ctx = make_attempt(repo)
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, guard.install(ctx.paths.private / "gitguard"))
    tools = Toolbox(Workspace(repo), shell=True, env=env)
    said = tools.call("shell", {"command": "git reset --hard"})
    assert said.startswith("exit status 1\nstella: git reset --hard is refused in the shared tree")
    assert tools.call("shell", {"command": "git status --short a.txt"}) == "exit status 0"


def test_add_rm_and_mv_into_an_index_of_its_own_pass_and_leave_the_users_index_alone(repo: Path) -> None:
    # aider `git add`s each file it creates; its pipeline gives it a copy of the index for that
    ctx = make_attempt(repo)
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    own = repo.parent / "own-index"
    shutil.copyfile(repo / ".git" / "index", own)
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, guard.install(ctx.paths.private / "gitguard"))
    (repo / "new.txt").write_text("new\n")
    added = subprocess.run(["git", "add", "new.txt"], cwd=repo, env={**env, "GIT_INDEX_FILE": str(own)})
    assert added.returncode == 0
    assert git("diff", "--cached", "--name-only", cwd=repo) == ""  # the user's index: nothing staged
    real = {**env, "GIT_INDEX_FILE": str(repo / ".git" / "index")}
    assert subprocess.run(["git", "add", "new.txt"], cwd=repo, env=real, capture_output=True).returncode == 1


def test_a_guard_left_on_path_without_its_variable_says_so_in_one_line_instead_of_running_itself(
    repo: Path,
) -> None:
    folder = guard.install(repo.parent / "gitguard")
    env = guard.guarded_env(os.environ, folder)
    del env[gitops.GUARD_VAR]  # as a tool that keeps PATH and drops the rest would
    stash = subprocess.run(
        ["git", "stash", "list"], cwd=repo, env=env, capture_output=True, text=True, timeout=30
    )
    assert (stash.returncode, stash.stdout) == (1, "")
    assert stash.stderr == (
        f"stella: the git guard found only itself as git ({folder / 'git'}): its folder is on PATH but "
        f"{gitops.GUARD_VAR}, which names it, was dropped from the environment; keep both or neither\n"
    )
    assert subprocess.run(["git", "status"], cwd=repo, env=env, capture_output=True).returncode == 0
