"""A shared commit's hooks run in the commit tree, which holds exactly the commit: a hook that formats and
re-stages puts its rewrite in the commit and in the shared tree (or leaves a file the worker changed since,
by name), one that rewrites without staging fails naming the files, and a `stella commit` killed at each
step leaves nothing the next one does not repair, the commit tree never half moved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.fleet import RUN, make_attempt, wait_for
from helpers.repo import StellaRunner, git, run_stella

from stellafleet.git import committree, hooks
from stellafleet.state.ledger import Ledger

# lint-staged's way: format each staged file, then stage the result
FORMAT_AND_RESTAGE = """#!/bin/sh
for f in $(git diff --cached --name-only --diff-filter=AM); do
  sed -i -e 's/  */ /g' "$f"
  [ -n "$EDIT_SHARED" ] && echo "the worker's later edit" >> "$EDIT_SHARED/$f"
  git add "$f"
done
"""
FORMAT_ONLY = """#!/bin/sh
for f in $(git diff --cached --name-only --diff-filter=AM); do sed -i -e 's/  */ /g' "$f"; done
"""


def _hook(repo: Path, name: str, text: str) -> None:
    hook = repo / ".git" / "hooks" / name
    hook.write_text(text)
    hook.chmod(0o755)


def test_a_restaged_rewrite_is_in_the_commit_and_in_the_shared_tree(
    git_repo: Path, stella: StellaRunner
) -> None:
    _hook(git_repo, "pre-commit", FORMAT_AND_RESTAGE)
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("spaced    out\n")
    done = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert done.returncode == 0, done.stderr
    assert git("show", "HEAD:a.txt", cwd=git_repo) == "spaced out\n"
    assert (git_repo / "a.txt").read_text() == "spaced out\n"
    assert "stella: a.txt: the hook's rewrite is in your tree too" in done.stderr
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""


def test_a_rewrite_of_a_file_changed_since_is_committed_and_the_file_left_alone(
    git_repo: Path, stella: StellaRunner
) -> None:
    _hook(git_repo, "pre-commit", FORMAT_AND_RESTAGE)
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("spaced    out\n")
    env = {**ctx.to_env(), "EDIT_SHARED": str(git_repo)}  # the hook edits the shared file as it runs
    done = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=env)
    assert done.returncode == 0, done.stderr
    assert git("show", "HEAD:a.txt", cwd=git_repo) == "spaced out\n"
    assert (git_repo / "a.txt").read_text() == "spaced    out\nthe worker's later edit\n"
    assert "stella: a.txt: the hook rewrote it, but it changed in your tree since: left alone" in done.stderr


def test_a_rewrite_left_unstaged_fails_the_commit_naming_the_file(
    git_repo: Path, stella: StellaRunner
) -> None:
    _hook(git_repo, "pre-commit", FORMAT_ONLY)
    ctx = make_attempt(git_repo)
    before = git("rev-parse", "HEAD", cwd=git_repo)
    (git_repo / "a.txt").write_text("spaced    out\n")
    refused = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0].startswith(
        "stella: error: pre-commit hook rewrote a.txt without staging it; nothing was committed"
    )
    assert git("rev-parse", "HEAD", cwd=git_repo) == before
    assert (git_repo / "a.txt").read_text() == "spaced out\n"  # the rewrite, for the next commit to take
    again = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert again.returncode == 0, again.stderr
    assert git("show", "HEAD:a.txt", cwd=git_repo) == "spaced out\n"


# held at one step of a commit while `gate` exists: the commit tree's move (after its checkout, before its
# clean), the pre-commit hook, or the branch's move in the lane
GATE = """#!/bin/sh
{stdin}
if [ -e {gate} ] && {when}; then
  rm -f {gate}; touch {entered}
  while [ ! -e {release} ]; do sleep 0.02; done
fi
exit 0
"""
STEPS = {
    "move": ("post-checkout", "", "true"),
    "hooks": ("pre-commit", "", "true"),
    "head": (
        "reference-transaction",
        "input=$(cat)",
        '[ "$1" = prepared ] && echo "$input" | grep -q refs/heads/',
    ),
}


def _commit_process(worker: subprocess.Popen[bytes]) -> psutil.Process:
    for child in psutil.Process(worker.pid).children(recursive=True):
        if "stellafleet" in " ".join(child.cmdline()):
            return child
    raise AssertionError("the worker's stella commit is not running")


@pytest.mark.parametrize("step", list(STEPS))
def test_a_commit_killed_at_each_step_is_repaired_by_the_next(
    git_repo: Path, tmp_path: Path, step: str
) -> None:
    ctx = make_attempt(git_repo)
    _hook(git_repo, "pre-commit", "#!/bin/sh\nexit 0\n")
    (git_repo / "first.txt").write_text("first\n")  # the commit tree made (and moved) once already
    assert run_stella("commit", "-m", "first", "first.txt", cwd=git_repo, env=ctx.to_env()).returncode == 0
    marks = {name: tmp_path / name for name in ("gate", "entered", "release")}
    name, stdin, when = STEPS[step]
    _hook(git_repo, name, GATE.format(stdin=stdin, when=when, **marks))
    marks["gate"].touch()
    (git_repo / "a.txt").write_text("a\n")
    command = f"{sys.executable} -m stellafleet commit -m 'Add a' a.txt; sleep 60"
    worker = subprocess.Popen(
        ["sh", "-c", command], cwd=git_repo, env={**os.environ, **ctx.to_env()}, start_new_session=True
    )
    try:
        wait_for(marks["entered"], timeout=30, process=worker)
        os.kill(_commit_process(worker).pid, signal.SIGKILL)
        marks["release"].touch()
        (git_repo / "b.txt").write_text("b\n")
        proc = run_stella("commit", "-m", "Add b", "b.txt", cwd=git_repo, env=ctx.to_env(), timeout=30)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert proc.returncode == 0, proc.stderr
    assert ("the commit tree was left half moved" in proc.stderr) == (step == "move")
    landed = git("log", "--format=%s", "HEAD", cwd=git_repo).split("\n")
    assert ("Add a" in landed) == (step == "head")  # killed after the branch moved: finished and recorded
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        recorded = {row["sha"] for row in ledger.get_run(RUN)["commits"]}
    assert recorded == set(
        git("rev-list", "HEAD", "--not", "HEAD~" + str(len(recorded)), cwd=git_repo).split()
    )
    tree = committree.tree_path(git_repo)
    assert not tree.with_name("tree.moving").exists()
    # not half moved: it holds exactly the last commit (its paths staged on its parent), nothing else
    assert git("write-tree", cwd=tree) == git("rev-parse", "HEAD^{tree}", cwd=git_repo)
    assert git("status", "--porcelain", "--untracked-files=all", cwd=tree) == "A  b.txt\n"
    # the user's index holds both commits' files, as HEAD has them
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""


NEEDS_INSTALL = "#!/bin/sh\n[ -e node_modules/.installed ] || { echo 'error: run pnpm install'; exit 1; }\n"


def test_the_commit_tree_is_readied_by_the_setup_and_a_failed_setup_refuses_the_commit(
    git_repo: Path, stella: StellaRunner
) -> None:
    (git_repo / ".gitignore").write_text("node_modules/\n")
    git("add", ".gitignore", cwd=git_repo)
    git("commit", "-q", "-m", "ignore node_modules", cwd=git_repo)
    _hook(git_repo, "pre-commit", NEEDS_INSTALL)
    config = git_repo / ".stella" / "config.toml"
    config.parent.mkdir(exist_ok=True)
    config.write_text('[worktree]\nsetup = "echo no network; exit 3"\n')
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    failed = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert failed.returncode == 1
    assert "could not be readied (setup failed: exit 3" in failed.stderr
    assert "commit-tree.log); nothing was committed" in failed.stderr
    config.write_text('[worktree]\nsetup = "mkdir -p node_modules && echo x >> node_modules/.installed"\n')
    done = stella("commit", "-m", "Add a", "a.txt", cwd=git_repo, env=ctx.to_env())
    assert done.returncode == 0, done.stderr  # the failed setup ran again, and the hook found its install
    assert (committree.tree_path(git_repo) / "node_modules" / ".installed").read_text() == "x\n"


@pytest.mark.parametrize("hooks_in", ["commit-tree", "shared-tree"])
def test_a_shared_commit_asks_git_where_the_hooks_are_once(
    git_repo: Path, stella: StellaRunner, tmp_path: Path, hooks_in: str
) -> None:
    for name in ("pre-commit", "commit-msg", "post-commit"):
        _hook(git_repo, name, "#!/bin/sh\nexit 0\n")
    (git_repo / ".stella").mkdir(exist_ok=True)
    (git_repo / ".stella" / "config.toml").write_text(f'[commit]\nhooks_in = "{hooks_in}"\n')
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    trace = tmp_path / "git-trace"
    done = stella(
        "commit", "-m", "Add a", "a.txt", cwd=git_repo, env={**ctx.to_env(), "GIT_TRACE": str(trace)}
    )
    assert done.returncode == 0, done.stderr
    asked = [line for line in trace.read_text().splitlines() if line.endswith("rev-parse --git-path hooks")]
    assert len(asked) == 1, asked


def test_the_commit_trees_hooks_are_the_same_folder_unless_a_relative_hooks_path_puts_one_in_each_tree(
    git_repo: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    default = hooks.installed(git_repo)
    assert default.where == (git_repo / ".git" / "hooks").resolve() and default.in_tree(tree) == default.where
    git("config", "core.hooksPath", ".husky/_", cwd=git_repo)
    assert hooks.installed(git_repo).in_tree(tree) == (tree / ".husky" / "_").resolve()
    git("config", "core.hooksPath", str(tmp_path / "shared-hooks"), cwd=git_repo)
    assert hooks.installed(git_repo).in_tree(tree) == tmp_path / "shared-hooks"
