"""The git guard (git/guard.py), in process: the script it installs and the environment naming it, the global
options that say which repository's aliases and remotes a command means, a patch's renames, and the exact
reason of each refusal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.git import gitops, guard

COMMIT = "stella commit -m MSG PATH..."


@pytest.fixture
def repo(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """git_repo with a.txt and b.txt, a remote origin, the aliases wipe and ad, and the tag guard-v1; next to
    it the repository other, with the alias oco and the mirror remote omirror. This process runs elsewhere."""
    for name in ("a.txt", "b.txt"):
        (git_repo / name).write_text(f"{name}\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    git("tag", "guard-v1", cwd=git_repo)
    git("remote", "add", "origin", str(git_repo), cwd=git_repo)
    git("config", "alias.wipe", "!rm -f b.txt", cwd=git_repo)
    git("config", "alias.ad", "add", cwd=git_repo)
    other = git_repo.parent / "other"
    other.mkdir()
    git("init", "-q", cwd=other)
    git("config", "alias.oco", "checkout", cwd=other)
    git("config", "remote.omirror.url", str(git_repo), cwd=other)
    git("config", "remote.omirror.fetch", "+refs/*:refs/*", cwd=other)
    monkeypatch.setenv("ALIAS_VALUE", "reset")  # for --config-env
    monkeypatch.chdir(git_repo.parent)
    return git_repo


def test_install_makes_its_folder_and_replaces_a_script_already_there(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "private" / "gitguard"
    guard.install(folder)
    assert guard.install(folder, guard.ISOLATED) == folder
    script = folder / gitops.PROGRAM
    assert "    commit) exec " in script.read_text()  # the second one, whole
    assert stat.S_IMODE(script.stat().st_mode) == 0o755  # nobody else may rewrite a worker's git
    assert [path.name for path in folder.iterdir()] == [gitops.PROGRAM]


def test_the_guards_environment_puts_its_folder_first_and_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "gitguard"
    assert guard.guarded_env({"PATH": "/x/bin", "HOME": "/h"}, folder) == {
        "PATH": f"{folder}{os.pathsep}/x/bin",
        "HOME": "/h",
        gitops.GUARD_VAR: str(folder),
    }
    assert guard.guarded_env({}, folder)["PATH"] == f"{folder}{os.pathsep}{os.defpath}"


# each with the start of its reason: the aliases and remotes of the repository the global options name
REFUSED = {
    "-C other oco -f": "git oco is the alias `checkout`: git checkout of the whole tree is refused",
    "--git-dir other/.git oco -f": "git oco is the alias `checkout`: git checkout of the whole tree",
    "--git-dir=other/.git oco -f": "git oco is the alias `checkout`: git checkout of the whole tree",
    "--config-env alias.zz=ALIAS_VALUE zz --hard": "git zz is the alias `reset`: git reset --hard is refused",
    "--config-env=alias.zz=ALIAS_VALUE zz --hard": "git zz is the alias `reset`: git reset --hard is refused",
    "-C other fetch omirror": "git fetch into refs/* is refused",
    "--git-dir=other/.git fetch omirror": "git fetch into refs/* is refused",
    "-c remote.m.url=x -c remote.m.fetch=+refs/*:refs/* fetch -j 2 m": "git fetch into refs/* is refused",
    "-c remote.m.url=x -c remote.m.fetch=+refs/*:refs/* fetch --multiple origin m": "git fetch into refs/*",
    "-C repo diff --output=../out.txt --output=b.txt": "git diff writing b.txt is refused",
    "-C repo diff --output=a.txt --output=b.txt": "git diff writing b.txt is refused",
    "-C repo checkout guard-v1": (
        f"git checkout of a branch or commit is refused in the shared tree ({guard.MOVES_HEAD}"
    ),
    "-C repo branch x": (
        "git branch is refused in the shared tree except to read (it writes refs every worker shares): "
        f"commit your files with {COMMIT}"
    ),
    "-C repo wipe": (
        "git wipe is refused in the shared tree (it is the shell alias `!rm -f b.txt`, whose commands the "
        "guard cannot see): run the git commands it stands for"
    ),
    "-C repo rerere forget b.txt": (
        "git rerere is refused in the shared tree (the guard runs only what it knows"
    ),
    "-C repo ad b.txt": "git ad is the alias `add`: git add is refused in the shared tree",
}  # fmt: skip
PASSED = [
    "-C repo fetch --multiple origin host:other.git",
    "-C repo fetch origin",
    "-C repo checkout -- a.txt",
]


def test_global_options_name_the_repository_whose_aliases_and_remotes_count(repo: Path) -> None:
    cwd = repo.parent
    said = {c: guard.refusal(c.split(), cwd, ["a.txt"], repo) for c in REFUSED}
    assert {c: why for c, why in said.items() if not (why or "").startswith(REFUSED[c])} == {}
    assert {c: why for c in PASSED if (why := guard.refusal(c.split(), cwd, ["a.txt"], repo))} == {}
    assert (repo / "b.txt").exists()  # judging ran nothing


def test_add_and_stage_pass_into_an_index_of_its_own_through_an_alias_too(repo: Path) -> None:
    commands = ["add b.txt", "stage b.txt", "ad b.txt", "-C . ad b.txt"]
    assert [guard.refusal(c.split(), repo, [], repo, private_index=True) for c in commands] == [None] * 4


def test_a_patchs_rename_is_judged_by_the_path_it_removes_too(repo: Path) -> None:
    git("mv", "a.txt", "z.txt", cwd=repo)
    patch = repo.parent / "rename.patch"
    patch.write_text(git("diff", "--cached", "-M", cwd=repo))
    git("reset", "-q", "--hard", cwd=repo)
    name = str(patch)
    said = [
        guard.refusal(command, repo, claimed, repo)
        for command, claimed in [
            (["apply", name], ["z.txt"]),  # it removes a.txt, another task's
            (["apply", "--", name], ["z.txt"]),
            (["apply", "-R", name], ["a.txt"]),  # backwards: it removes z.txt
            (["apply", name], ["a.txt", "z.txt"]),
            (["apply", "-R", name], ["a.txt", "z.txt"]),
        ]
    ]
    assert [str(why).partition(" is refused")[0] for why in said] == [
        "git apply of a.txt",
        "git apply of a.txt",
        "git apply of z.txt",
        "None",
        "None",
    ]
    assert (repo / "a.txt").exists() and not (repo / "z.txt").exists()  # judging applied nothing


# guardforms: how the files a command writes are read from its options, and the lfs verbs that only read
FORMS_REFUSED = {
    "diff --output=x=b.txt": "git diff writing x=b.txt is refused",  # only the first `=` ends the option
    "archive -ob.zip HEAD": "git archive writing b.zip is refused",
    "format-patch --output-directory=sub -1": "git format-patch writing sub is refused",
    "format-patch --output-directory sub -1": "git format-patch writing sub is refused",
    "init --template /elsewhere sub": "git init into sub is refused",
    "clone /": "git clone into . is refused",
    "clone /x/y.git/": "git clone into y is refused",  # a URL with no last part: named by where it runs
}
FORMS_PASSED = [
    "archive HEAD -o",  # no value: git refuses it, no file is named
    "merge-file --stdout b.txt base other",
    "merge-file -L mine -L base -L theirs a.txt base other",
    "clone",
    "lfs env",
    "lfs version",
    "lfs ext",
    "lfs locks",
]


def test_the_files_a_command_writes_are_read_from_its_options_and_lfs_reads_run(repo: Path) -> None:
    said = {c: guard.refusal(c.split(), repo, ["a.txt"], repo) for c in FORMS_REFUSED}
    assert {c: why for c, why in said.items() if not (why or "").startswith(FORMS_REFUSED[c])} == {}
    assert {c: why for c in FORMS_PASSED if (why := guard.refusal(c.split(), repo, ["a.txt"], repo))} == {}


def test_judging_a_patch_applies_nothing_and_names_each_path_whole(repo: Path) -> None:
    (repo / "b.txt").write_text("changed\n")
    (repo.parent / "b.patch").write_text(git("diff", "b.txt", cwd=repo))
    git("checkout", "--", "b.txt", cwd=repo)
    (repo / "tab\there.txt").write_text("a name with a tab\n")
    git("add", ".", cwd=repo)
    (repo.parent / "tab.patch").write_text(git("diff", "--cached", cwd=repo))
    git("rm", "-q", "--cached", "tab\there.txt", cwd=repo)
    (repo / "tab\there.txt").unlink()
    before = (repo / "b.txt").stat()
    commands = [
        "apply --check --apply ../b.patch",
        "apply -p1 --apply --stat ../b.patch",
        "apply ../tab.patch",
    ]
    assert [
        str(guard.refusal(c.split(), repo, ["a.txt"], repo)).partition(" is refused")[0] for c in commands
    ] == [
        "git apply of b.txt",
        "git apply of b.txt",
        "git apply of tab\there.txt",
    ]
    assert guard.refusal(["apply", "--check", "../b.patch"], repo, ["a.txt"], repo) is None  # it only reports
    after = (repo / "b.txt").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # nothing applied it
    assert not (repo / "tab\there.txt").exists()
