"""The git guard's own process (git/guard.py's main), run in this one: a refusal's line on stderr and in the
task's log, a command handed to the real git with no trace of the guard, git outside a worker, the private
index rule, an isolated worker's commit under the hook lock, and the claims it reads.

main ends by handing over to git with os.execve (runner.become), which would replace pytest itself: these
tests put in its place a function that raises Handed with the argv and environment it was given."""

from __future__ import annotations

import dataclasses
import locale
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, guard, hooks, hookstash
from stellafleet.state.claims import ClaimStore, Holder


class Handed(Exception):
    """runner.become called: what git would have run with."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        super().__init__(argv)
        self.argv, self.env = list(argv), dict(env)


@dataclasses.dataclass
class Worker:
    repo: Path
    ctx: WorkerContext
    folder: Path  # the guard's folder
    env: dict[str, str]  # the worker's environment, the guard on its PATH
    plain_path: str  # PATH without the guard
    git: str  # the real git


@pytest.fixture
def worker(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> Worker:
    """A shared worker of a task that claimed a.txt and src/x.py, in git_repo (a.txt, b.txt committed); this
    process's cwd is the repository and its PATH the worker's, as in the guard's process."""
    for name in ("a.txt", "b.txt"):
        (git_repo / name).write_text(f"{name}\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    (git_repo / "src").mkdir()
    ctx = make_attempt(git_repo)
    _claim(ctx, ["a.txt", "src/x.py"])
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    folder = guard.install(ctx.paths.private / "gitguard")
    plain_path = os.environ["PATH"]
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, folder)
    for name in ("PATH", gitops.GUARD_VAR):
        monkeypatch.setenv(name, env[name])
    monkeypatch.chdir(git_repo)

    def become(argv: Sequence[str], env: Mapping[str, str]) -> None:
        raise Handed(argv, env)  # exec cannot run inside pytest: it would replace the test process

    monkeypatch.setattr("stellafleet.proc.runner.become", become)
    real = shutil.which("git", path=plain_path)
    assert real is not None
    return Worker(git_repo, ctx, folder, env, plain_path, real)


def _claim(ctx: WorkerContext, paths: list[str]) -> None:
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(paths, Holder.current(ctx.run_id, ctx.task_id, "", ctx.attempt_id))


def _handed(env: Mapping[str, str], *argv: str) -> Handed:
    with pytest.raises(Handed) as got:
        guard.main(argv, env)
    return got.value


def _unguarded(worker: Worker, env: Mapping[str, str]) -> dict[str, str]:
    """env as git gets it: the guard's variable dropped, its folder off PATH."""
    kept = {name: value for name, value in env.items() if name != gitops.GUARD_VAR}
    return {**kept, "PATH": worker.plain_path}


def test_a_refused_command_says_its_one_line_on_stderr_and_appends_it_to_the_tasks_log(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    worker.ctx.log_path.write_text("the worker's earlier output\n")
    assert guard.main(["stash"], worker.env) == 1
    line = (
        "stella: git stash is refused in the shared tree (other workers' edits live here): "
        "use stella commit -m MSG PATH...\n"
    )
    assert capsys.readouterr() == ("", line)
    assert guard.main(["checkout", "--", "b.txt"], worker.env) == 1
    second = capsys.readouterr().err
    assert second.startswith("stella: git checkout of b.txt is refused in the shared tree")
    assert worker.ctx.log_path.read_text() == "the worker's earlier output\n" + line + second
    assert git("stash", "list", cwd=worker.repo) == ""


def test_a_refusal_is_logged_in_utf8_whatever_the_workers_locale(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(
        locale.LC_CTYPE, "C"
    )  # a worker whose locale is not UTF-8 (ASCII, where it is not forced)
    try:
        assert guard.main(["checkout", "--", "café.txt"], worker.env) == 1
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)
    line = capsys.readouterr().err
    assert line.startswith("stella: git checkout of café.txt is refused")
    assert worker.ctx.log_path.read_bytes().decode("utf-8") == line


def test_an_allowed_command_is_handed_to_the_real_git_without_the_guard(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    handed = _handed(worker.env, "checkout", "--", "a.txt")
    assert handed.argv == [worker.git, "checkout", "--", "a.txt"]  # not the guard's script
    assert handed.env == _unguarded(worker, worker.env)
    assert str(worker.folder) not in handed.env["PATH"].split(os.pathsep)
    assert capsys.readouterr() == ("", "")
    assert not worker.ctx.log_path.exists()


def test_paths_are_judged_from_the_directory_git_runs_in(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(worker.repo / "src")
    assert _handed(worker.env, "checkout", "--", "x.py").argv[1:] == ["checkout", "--", "x.py"]  # src/x.py
    assert guard.main(["checkout", "--", "../b.txt"], worker.env) == 1
    assert guard.main(["checkout", "--", "a.txt"], worker.env) == 1  # src/a.txt: not claimed


@pytest.mark.parametrize(
    "context", [{}, {"STELLA_ATTEMPT_ID": "not a number"}], ids=["no context", "an invalid context"]
)
def test_outside_a_worker_git_runs_unguarded(worker: Worker, context: dict[str, str]) -> None:
    env = {
        **{name: value for name, value in worker.env.items() if name not in WorkerContext.env_names()},
        **context,
    }
    handed = _handed(env, "stash", "list")
    assert (handed.argv, handed.env) == ([worker.git, "stash", "list"], _unguarded(worker, env))


def test_add_passes_only_into_an_index_other_than_the_worktrees_own(worker: Worker) -> None:
    own = worker.repo.parent / "own-index"
    shutil.copyfile(worker.repo / ".git" / "index", own)
    env = {**worker.env, "GIT_INDEX_FILE": str(own)}
    assert _handed(env, "add", "b.txt").env["GIT_INDEX_FILE"] == str(own)
    assert guard.main(["add", "b.txt"], worker.env) == 1  # no GIT_INDEX_FILE: the user's index
    for same in (".git/index", str(worker.repo / "src" / ".." / ".git" / "index")):
        assert guard.main(["add", "b.txt"], {**worker.env, "GIT_INDEX_FILE": same}) == 1, same


def test_claims_are_the_attempts_own_and_none_without_a_claim_store(git_repo: Path) -> None:
    ctx = make_attempt(git_repo)
    ctx.paths.store_db.unlink(missing_ok=True)
    assert guard._claimed(ctx) == []
    assert not ctx.paths.store_db.exists()  # reading made no store
    _claim(ctx, ["b.txt", "a.txt"])
    other = make_attempt(git_repo, "t2")
    _claim(other, ["c.txt"])
    assert (guard._claimed(ctx), guard._claimed(other)) == (["a.txt", "b.txt"], ["c.txt"])


def test_a_guard_found_alone_on_path_exits_in_one_line(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert guard._real_git() == worker.git  # named by its variable, the guard is skipped
    monkeypatch.delenv(gitops.GUARD_VAR)
    with pytest.raises(SystemExit) as exited:
        guard._real_git()
    assert str(exited.value.code) == (
        f"stella: the git guard found only itself as git ({worker.folder / 'git'}): its folder is on PATH "
        f"but {gitops.GUARD_VAR}, which names it, was dropped from the environment; keep both or neither"
    )


_HOOK = """#!{python}
# notes whether the hook lock is held while the hook runs, and the hook's session
import fcntl, os, sys
fd = os.open({lock!r}, os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    held = False
except BlockingIOError:
    held = True
with open({record!r}, "a") as record:
    record.write(f"{{held}} {{os.getsid(0)}}\\n")
print("the hook ran", file=sys.stderr)
"""


def test_an_isolated_workers_commit_runs_under_the_hook_lock_and_the_rest_is_handed_over(
    worker: Worker, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = worker.repo.parent / "tree"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=worker.repo)
    ctx = dataclasses.replace(worker.ctx, isolation="isolated", branch="fleet/t1", workspace=tree)
    env = {**worker.env, **ctx.to_env(), "GIT_AUTHOR_NAME": "The Worker"}
    record = worker.repo.parent / "hook-record"
    lock = ctx.paths.private / hookstash.LOCK_NAME
    hook = hooks.hooks_dir(worker.repo) / "pre-commit"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(_HOOK.format(python=sys.executable, lock=str(lock), record=str(record)))
    hook.chmod(0o755)
    monkeypatch.chdir(tree)
    handed = _handed(env, "stash", "-u")  # its own worktree: no rule to judge it by
    assert (handed.argv, handed.env) == ([worker.git, "stash", "-u"], _unguarded(worker, env))
    (tree / "new.txt").write_text("new\n")
    git("add", "new.txt", cwd=tree)
    capfd.readouterr()
    assert guard.main(["-c", "core.quotepath=off", "commit", "-m", "mine"], env) == 0
    out, err = capfd.readouterr()
    assert "[fleet/t1 " in out and " mine\n" in out  # git's own output reaches the worker
    assert err == "the hook ran\n"
    assert record.read_text() == f"True {os.getsid(0)}\n"  # under the lock, in the worker's session
    assert git("log", "-1", "--format=%an %s", cwd=tree) == "The Worker mine\n"
    assert guard.main(["commit", "-m", "nothing staged"], env) == 1  # git's own exit code
    assert git("rev-parse", "main", cwd=worker.repo) != git("rev-parse", "fleet/t1", cwd=worker.repo)
