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
# issue 49 item 2: what writes the index, HEAD, refs, unclaimed files or the repository's config; each with
# the start of its reason
WRITES_REFUSED = {
    "checkout -f": "git checkout of the whole tree", "checkout --force": "git checkout of the whole tree",
    "checkout -qf": "git checkout of the whole tree", "checkout -f b.txt": "git checkout of b.txt",
    "checkout --force -- b.txt": "git checkout of b.txt", "checkout --detach": "git checkout of a branch",
    "checkout -d": "git checkout of a branch", "checkout -bx": "git checkout of a branch",
    "checkout --orphan x": "git checkout of a branch", "checkout -B x": "git checkout of a branch",
    "checkout --orphan=x": "git checkout of a branch", "checkout -- main": "git checkout of main",
    "checkout --pathspec-from-file=l=b": "git checkout of b.txt",
    "checkout --pathspec-from-file=binlist": "git checkout of",
    "checkout --pathspec-from-file listb -q": "git checkout of b.txt",
    "checkout -- ../outside b.txt": "git checkout of b.txt",
    "-C sub checkout -- ../b.txt": "git checkout of b.txt", "reset --hard": "git reset --hard is refused",
    "reset --merge": "git reset --merge is refused", "reset --keep HEAD": "git reset --keep is refused",
    "symbolic-ref --delete HEAD": "git symbolic-ref", "config set": "git config",
    "config unset": "git config",
    "config --edit": "git config", "apply --3way a.patch": "git apply to the index",
    "apply -p 1": "git apply of a patch on stdin",
    "checkout --pathspec-from-file": "git checkout of the whole tree",
    "checkout -p": "git checkout of the whole tree",
    "checkout-index -a -f": "git checkout-index of the whole tree",
    "checkout-index --all": "git checkout-index of the whole tree",
    "checkout-index --stdin": "git checkout-index of the whole tree",
    "checkout-index -f b.txt": "git checkout-index of b.txt",
    "checkout --pathspec-from-file=listb": "git checkout of b.txt",
    "checkout --pathspec-from-file listb": "git checkout of b.txt",
    "checkout --pathspec-from-file=-": "git checkout of the whole tree",
    "checkout --pathspec-from-file=missing": "git checkout of the whole tree",
    "checkout --pathspec-from-file=nul --pathspec-file-nul": "git checkout of b.txt",
    "restore --pathspec-from-file=listb": "git restore of b.txt",
    "read-tree HEAD": "git read-tree is refused", "update-index --add b.txt": "git update-index is refused",
    "update-ref refs/heads/main HEAD~1": "git update-ref is refused", "am x.patch": "git am is refused",
    "symbolic-ref HEAD refs/heads/other": (
        "git symbolic-ref is refused in the shared tree except to read (it moves HEAD"
    ),
    "symbolic-ref -d HEAD": "git symbolic-ref is refused",
    "sparse-checkout set x": "git sparse-checkout is refused", "sparse-checkout init": "git sparse-checkout",
    "config core.hooksPath /x": "git config is refused", "config --global user.name X": "git config",
    "config --unset core.x": "git config", "config --add core.x y": "git config", "config -e": "git config",
    "config set core.x y": "git config", "config unset core.x": "git config", "config edit": "git config",
    "config --file .git/config core.x y": "git config",
    "branch x": "git branch is refused", "branch -f main HEAD~1": "git branch", "branch -D x": "git branch",
    "branch -m main x": "git branch", "branch -v x": "git branch",
    "branch --set-upstream-to=origin/main": "git branch",
    "tag v1": "git tag is refused", "tag -d v1": "git tag", "tag -a v1 -m x": "git tag",
    "reflog expire --all": "git reflog is refused", "reflog delete HEAD@{0}": "git reflog",
    "worktree add ../x": "git worktree is refused", "notes add -m x": "git notes is refused",
    "replace HEAD HEAD~1": "git replace is refused", "remote add o /x": "git remote is refused",
    "remote set-url origin /x": "git remote", "submodule update --init": "git submodule is refused",
    "apply b.patch": "git apply of b.txt", "apply --index a.patch": "git apply to the index",
    "apply --cached a.patch": "git apply to the index", "apply -3 a.patch": "git apply to the index",
    "apply": "git apply of a patch on stdin",
    "apply -p1 --apply --stat b.patch": "git apply of b.txt", "apply ab.patch": "git apply of b.txt",
    "apply rename.patch": "git apply of z.txt", "bisect start": "git bisect is refused",
    "--no-pager stash": "git stash is refused", "-P stash": "git stash is refused",
    "-C . -C . stash": "git stash is refused", "-C sub -C .. checkout -- b.txt": "git checkout of b.txt",
    "restore -s HEAD b.txt": "git restore of b.txt", "restore --source=HEAD~1 b.txt": "git restore of b.txt",
    "checkout --conflict=merge b.txt": "git checkout of b.txt", "checkout HEAD~1 -- b.txt": "git checkout of",
}  # fmt: skip
# what only reads (or writes only claimed paths) runs
WRITES_PASSED = [
    "checkout -q", "checkout -f -- a.txt", "checkout --force a.txt", "checkout-index",
    "checkout-index -f a.txt",
    "checkout --pathspec-from-file=lista", "checkout --pathspec-from-file lista",
    "checkout --pathspec-from-file=nula --pathspec-file-nul", "symbolic-ref HEAD",
    "symbolic-ref --short HEAD",
    "sparse-checkout list", "config core.hooksPath", "config --get core.x", "config -l", "config get core.x",
    "config --list --show-origin", "config --get-regexp core", "branch", "branch -a", "branch -vv",
    "branch --show-current", "branch --list 'f*'", "branch --contains HEAD", "tag", "tag -l", "tag -n",
    "tag -v v1", "reflog", "reflog show HEAD", "worktree list", "notes", "notes show", "-P log",
    "--no-pager diff",
    "-C sub -C .. status", "restore -s HEAD~1 a.txt", "restore --source HEAD a.txt", "restore -sHEAD a.txt",
    "remote", "remote -v", "remote get-url origin", "submodule", "submodule status", "apply a.patch",
    "apply --check b.patch", "apply --numstat b.patch", "apply --summary b.patch", "apply missing.patch",
    "branch --sort committerdate", "config --file other.cfg core.x", "notes --ref x list", "notes list",
    "remote show origin", "submodule summary", "checkout -q --quiet --progress --no-progress", "--version",
    "checkout HEAD --pathspec-from-file=lista", "config --get-colorbool color.diff true", "config list",
    "config --get-colorbool x",
    "branch --format %(refname)", "worktree", "apply --stat b.patch", "apply -p 1 a.patch",
    "checkout --conflict merge a.txt", "checkout --conflict=merge -- a.txt", "rm --cached a.txt",
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


def _path_lists(repo: Path) -> None:
    """Pathspec lists and patches, of the claimed a.txt and of b.txt."""
    (repo / "binlist").write_bytes(b"\xff\nb.txt\n")
    (repo / "-").write_text("a.txt\n")  # `--pathspec-from-file=-` is stdin, not this file
    (repo / "l=b").write_text("b.txt\n")
    for name in ("a.txt", "b.txt"):
        (repo / name).write_text("changed\n")
        (repo / name.replace(".txt", ".patch")).write_text(git("diff", name, cwd=repo))
    (repo / "ab.patch").write_text(git("diff", cwd=repo))
    git("checkout", "--", "a.txt", "b.txt", cwd=repo)
    git("mv", "a.txt", "z.txt", cwd=repo)
    (repo / "rename.patch").write_text(git("diff", "--cached", "-M", cwd=repo))
    git("mv", "z.txt", "a.txt", cwd=repo)
    for name, text in {
        "lista": "a.txt\n",
        "listb": "a.txt\nb.txt\n",
        "nula": "a.txt\0",
        "nul": "b.txt\0",
    }.items():
        (repo / name).write_text(text)
    (repo / "sub").mkdir()


def test_what_writes_the_index_head_refs_config_or_unclaimed_files_is_refused(repo: Path) -> None:
    _path_lists(repo)
    said = {command: guard.refusal(command.split(), repo, ["a.txt"], repo) for command in WRITES_REFUSED}
    wrong = {
        command: why for command, why in said.items() if not (why or "").startswith(WRITES_REFUSED[command])
    }
    assert wrong == {}
    assert git("status", "--porcelain", "--", "a.txt", "b.txt", cwd=repo) == ""  # the guard applied nothing
    assert [command for command, why in said.items() if "is refused in the shared tree" not in str(why)] == []


def test_what_only_reads_or_writes_claimed_files_passes_whatever_its_options(repo: Path) -> None:
    _path_lists(repo)
    refused = {
        command: why
        for command in WRITES_PASSED
        if (
            why := guard.refusal(
                command.split(), repo, ["a.txt"], repo, private_index=command.startswith("rm")
            )
        )
    }
    assert refused == {}


def test_add_rm_and_mv_pass_only_into_an_index_of_its_own(repo: Path) -> None:
    commands = ["add b.txt", "rm b.txt", "mv a.txt z.txt", "rm --cached a.txt"]
    assert [guard.refusal(c.split(), repo, [], repo, private_index=True) for c in commands] == [None] * 4
    said = [str(guard.refusal(c.split(), repo, [], repo)) for c in commands]
    assert [
        why
        for why in said
        if "is refused in the shared tree (it stages into the user's own index)" not in why
    ] == []


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


def test_the_script_refuses_what_would_wipe_edits_rewrite_refs_or_config_and_nothing_changes(
    repo: Path,
) -> None:
    # issue 49 item 2: each of these did damage in a shared tree; through the real script, none does
    ctx = make_attempt(repo)
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(["a.txt"], Holder.current(ctx.run_id, ctx.task_id, "", ctx.attempt_id))
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, guard.install(ctx.paths.private / "gitguard"))
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    (repo / "b.txt").write_text("another worker's\n")
    (repo / "new.txt").write_text("the user's new file\n")
    git("add", "new.txt", cwd=repo)
    (repo / "listb").write_text("b.txt\n")
    head, config = git("rev-parse", "HEAD", cwd=repo), (repo / ".git" / "config").read_text()
    commands = [
        ["checkout", "-f"], ["checkout", "--force"], ["checkout-index", "-a", "-f"],
        ["checkout", "--pathspec-from-file=listb"], ["read-tree", "HEAD"],
        ["update-ref", "refs/heads/main", "HEAD~1"],
        ["symbolic-ref", "HEAD", "refs/heads/other"], ["sparse-checkout", "set", "x"],
        ["config", "core.hooksPath", "/x"], ["--no-pager", "stash"], ["-P", "stash"],
        ["-C", ".", "-C", ".", "stash"],
    ]  # fmt: skip
    done = {
        " ".join(args): subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
        for args in commands
    }
    assert {command: (run.returncode, run.stderr[:8]) for command, run in done.items()} == dict.fromkeys(
        done, (1, "stella: ")
    )
    assert (repo / "b.txt").read_text() == "another worker's\n"
    assert (repo / "new.txt").read_text() == "the user's new file\n"
    assert git("status", "--porcelain", "--", "b.txt", "new.txt", cwd=repo) == " M b.txt\nA  new.txt\n"
    assert (git("rev-parse", "HEAD", cwd=repo), git("symbolic-ref", "HEAD", cwd=repo)) == (
        head,
        "refs/heads/main\n",
    )
    assert (repo / ".git" / "config").read_text() == config
    assert git("stash", "list", cwd=repo) == ""
    assert len(ctx.log_path.read_text().splitlines()) == len(commands)


def test_the_script_skips_the_value_of_a_global_option_that_looks_like_a_subcommand(repo: Path) -> None:
    # `-C stash` names a directory: the script runs the real git itself (without the guard's variable, handing
    # it to python would say "found only itself" and exit 1)
    (repo / "stash").mkdir()
    env = guard.guarded_env(os.environ, guard.install(repo.parent / "gitguard"))
    del env[gitops.GUARD_VAR]
    for args in (["-C", "stash", "status"], ["-c", "x.y=1", "-C", "stash", "--no-pager", "log", "-1"]):
        run = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
        assert (run.returncode, run.stderr) == (0, ""), args
    assert subprocess.run(["git", "-C", ".", "stash"], cwd=repo, env=env, capture_output=True).returncode == 1


def test_outside_a_worker_the_guard_runs_the_real_git(repo: Path) -> None:
    env = guard.guarded_env(os.environ, guard.install(repo.parent / "gitguard"))  # no worker's context
    run = subprocess.run(["git", "stash", "list"], cwd=repo, env=env, capture_output=True, text=True)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


# The guard is an allow list: what it has no rule for is refused; an alias is judged by what it stands for;
# fetch runs only into refs/remotes/; what writes a file by name runs only for a claimed file or outside the
# tree. Each with the start of its reason.
ALLOW_LIST_REFUSED = {
    "co -f": "git co is the alias `checkout`: git checkout of the whole tree is refused",
    "co -- b.txt": "git co is the alias `checkout`: git checkout of b.txt",
    "--no-pager co --force": "git co is the alias `checkout`: git checkout of the whole tree",
    "wipe": "git wipe is refused in the shared tree (it is the shell alias `!rm -f b.txt`",
    "-c alias.zz=reset zz --hard": "git zz is the alias `reset`: git reset --hard is refused",
    "hard": "git hard is the alias `reset --hard`: git reset --hard",
    "again -f": "git again is the alias `co`: git checkout of the whole tree",
    "loop1": "git loop1 is the alias `loop2`: git loop1 is refused",
    "fetch origin +main:other": "git fetch into other is refused",
    "fetch . HEAD~1:somebranch": "git fetch into somebranch is refused",
    "fetch mirror": "git fetch into refs/*",
    "fetch --all": "git fetch into refs/*", "fetch": "git fetch into refs/*",
    "fetch --prune-tags origin": "git fetch --prune-tags is refused",
    "fetch --depth=1 origin": "git fetch --depth",
    "fetch --unshallow origin": "git fetch --unshallow", "fetch --refmap= origin": "git fetch --refmap",
    "push . HEAD:main": "git push is refused", "push origin main": "git push is refused",
    "gc --prune=now": "git gc is refused", "prune": "git prune is refused",
    "repack -d": "git repack is refused",
    "prune-packed": "git prune-packed", "maintenance run": "git maintenance is refused",
    "pack-refs --all": "git pack-refs is refused", "reflog expire --all": "git reflog is refused",
    "lfs checkout": "git lfs is refused", "lfs pull": "git lfs", "lfs fetch": "git lfs",
    "lfs track x": "git lfs",
    "merge-file b.txt base other": "git merge-file writing b.txt is refused",
    "init": "git init into . is refused", "init sub": "git init into sub", "-C sub init": "git init into sub",
    "clone /x/y.git": "git clone into y is refused", "clone --depth 1 /x/y sub": "git clone into sub",
    "archive -o b.zip HEAD": "git archive writing b.zip is refused",
    "archive --output=b.zip HEAD": "git archive",
    "format-patch -1": "git format-patch writing . is refused", "format-patch -osub -1": "git format-patch",
    "diff --output=b.txt": "git diff writing b.txt is refused",
    "-P log --output=b.txt": "git log writing b.txt",
    "bundle create b.bundle HEAD": "git bundle writing b.bundle is refused",
    "stage b.txt": "git stage is refused",
    "rerere forget b.txt": "git rerere is refused", "fast-import": "git fast-import is refused",
    "danger": "git danger is refused", "nosuch": "git nosuch is refused in the shared tree (no git command",
    "-c help.autocorrect=-1 chekout -f": "git chekout is refused in the shared tree (no git command",
    "credential-store erase": "git credential-store is refused",
}  # fmt: skip
ALLOW_LIST_PASSED = [
    "co -- a.txt", "co --force a.txt", "st", "-c alias.zz=status zz", "lp", "again -- a.txt", "fetch origin",
    "fetch origin main", "fetch . main", "fetch origin main:refs/remotes/origin/x", "fetch -p origin",
    "fetch /elsewhere main", "lfs", "lfs ls-files", "lfs status", "merge-file -p b.txt base other",
    "merge-file a.txt base other", "init {out}", "-C {out} init", "clone /x/y {out}", "archive HEAD",
    "archive -o {out}/a.zip HEAD", "format-patch --stdout -1", "format-patch -o {out} -1",
    "diff --output=a.txt", "log --output={out}/log", "diff -- --output=b.txt", "hash-object -w a.txt",
    "merge-tree HEAD HEAD", "bundle verify x", "bundle create -q - HEAD", "status", "-C sub status",
]  # fmt: skip


@pytest.fixture
def allow_list(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Aliases a user may have, a remote, a mirror remote, and an external git-danger command on PATH."""
    aliases = {
        "co": "checkout",
        "st": "status",
        "wipe": "!rm -f b.txt",
        "lp": "log -P",
        "hard": "reset --hard",
    }
    for name, value in {**aliases, "again": "co", "loop1": "loop2", "loop2": "loop1"}.items():
        git("config", f"alias.{name}", value, cwd=repo)
    git("remote", "add", "origin", str(repo), cwd=repo)
    git("config", "remote.mirror.url", str(repo), cwd=repo)
    git("config", "remote.mirror.fetch", "+refs/*:refs/*", cwd=repo)
    (repo / "sub").mkdir()
    tools = repo.parent / "tools"
    tools.mkdir()
    (tools / "git-danger").write_text("#!/bin/sh\nrm -f b.txt\n")
    (tools / "git-danger").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return repo.parent / "out"


def test_what_the_guard_has_no_rule_for_is_refused_and_an_alias_by_what_it_stands_for(
    repo: Path, allow_list: Path
) -> None:
    said = {c: guard.refusal(c.split(), repo, ["a.txt"], repo) for c in ALLOW_LIST_REFUSED}
    wrong = {c: why for c, why in said.items() if not (why or "").startswith(ALLOW_LIST_REFUSED[c])}
    assert wrong == {}
    assert [c for c, why in said.items() if "is refused in the shared tree" not in str(why)] == []
    assert (repo / "b.txt").exists()  # judging ran nothing


def test_reads_fetches_into_remote_tracking_refs_and_files_written_outside_the_tree_pass(
    repo: Path, allow_list: Path
) -> None:
    commands = [command.format(out=allow_list) for command in ALLOW_LIST_PASSED]
    refused = {c: why for c in commands if (why := guard.refusal(c.split(), repo, ["a.txt"], repo))}
    assert refused == {}


def test_the_script_runs_what_only_reads_without_python_and_hands_everything_else_to_it(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a read-only command must not start Python: the guard's python here only notes what it was handed
    handed = repo.parent / "handed"
    python = repo.parent / "python"
    python.write_text(f'#!/bin/sh\nshift 3\necho "$@" >> {handed}\nexit 3\n')
    python.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(python))
    env = guard.guarded_env(os.environ, guard.install(repo.parent / "gitguard"))
    reads = [
        "status", "log -1", "-C . --no-pager diff HEAD", "-c x.y=1 rev-parse HEAD", "ls-files", "--version",
        "diff -- --output=x", "blame a.txt", "cat-file -t HEAD",
    ]  # fmt: skip
    handed_over = [
        "co -f", "gc", "fetch", "diff --output=x", "log --output x", "lfs pull", "frobnicate", "stash",
        "-P config core.x", "-C . checkout -f",
    ]  # fmt: skip
    codes = {
        command: subprocess.run(["git", *command.split()], cwd=repo, env=env, capture_output=True).returncode
        for command in reads + handed_over
    }
    assert codes == {**dict.fromkeys(reads, 0), **dict.fromkeys(handed_over, 3)}
    assert handed.read_text().splitlines() == handed_over


def test_the_script_refuses_a_users_alias_by_what_it_stands_for_and_nothing_changes(repo: Path) -> None:
    # issue 49 item 2: `git co -f` (co = checkout, the user's alias) wiped another worker's edit
    ctx = make_attempt(repo)
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(["a.txt"], Holder.current(ctx.run_id, ctx.task_id, "", ctx.attempt_id))
    env = guard.guarded_env({**os.environ, **ctx.to_env()}, guard.install(ctx.paths.private / "gitguard"))
    ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
    git("config", "alias.co", "checkout", cwd=repo)
    git("config", "alias.wipe", "!rm -f b.txt", cwd=repo)
    (repo / "a.txt").write_text("mine\n")
    (repo / "b.txt").write_text("another worker's\n")
    tips = git("for-each-ref", cwd=repo)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)

    refused = [["co", "-f"], ["co", "--", "b.txt"], ["wipe"], ["fetch", ".", "HEAD:refs/heads/x"], ["gc"]]
    said = [run(*args) for args in refused]
    assert [(done.returncode, done.stderr[:8]) for done in said] == [(1, "stella: ")] * len(refused)
    assert said[0].stderr.startswith("stella: git co is the alias `checkout`: git checkout of the whole tree")
    assert (repo / "b.txt").read_text() == "another worker's\n"
    assert git("for-each-ref", cwd=repo) == tips
    assert run("co", "--", "a.txt").returncode == 0  # its own claimed file, through the alias
    assert (repo / "a.txt").read_text() == "a.txt\n"
    assert len(ctx.log_path.read_text().splitlines()) == len(refused)
