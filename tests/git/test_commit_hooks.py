"""The repository's hooks run for `stella commit`, with the real pre-commit framework and real local hooks.

The framework is installed the way a project installs it (`pre-commit install`), its hooks are `repo:
local` ones (pygrep and system), so no network is needed. In the shared tree they run on exactly the
committed paths and never touch another worker's files: one test commits from four workers at once while
another process keeps writing a tracked file it never commits, which a stash of unstaged changes (what the
framework does for a plain `git commit`) would take from under it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.fleet import RUN, make_attempt
from helpers.repo import StellaRunner, git

from stellafleet.state.ledger import Ledger

if importlib.util.find_spec("pre_commit") is None:  # a dev dependency: missing only in a partial setup
    REASON = "the pre-commit framework is not installed: pip install -e '.[dev]'"
    if os.environ.get("CI") == "true":
        pytest.fail(REASON, pytrace=False)
    pytest.skip(REASON, allow_module_level=True)

CONFIG = textwrap.dedent("""\
    repos:
      - repo: local
        hooks:
          - id: no-fixme
            name: no FIXME-STELLA markers
            language: pygrep
            entry: FIXME-STELLA
          - id: strip-trailing-space
            name: strip trailing whitespace
            language: system
            entry: sed -i -e 's/[[:space:]]*$//'
            types: [text]
          - id: slow-check
            name: a check that takes a moment (widens the window for the concurrent test)
            language: system
            entry: sh -c 'sleep "${SLOW_HOOK_S:-0}"' --
            pass_filenames: false
""")


def install_pre_commit(repo: Path) -> None:
    (repo / ".pre-commit-config.yaml").write_text(CONFIG)
    git("add", ".pre-commit-config.yaml", cwd=repo)
    git("commit", "-q", "-m", "pre-commit config", cwd=repo)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True)


def head(repo: Path) -> str:
    return git("rev-parse", "HEAD", cwd=repo).strip()


def test_a_failing_hook_fails_the_commit_with_its_output_and_a_fixed_file_commits(
    git_repo: Path, stella: StellaRunner
) -> None:
    install_pre_commit(git_repo)
    ctx = make_attempt(git_repo)
    before = head(git_repo)
    (git_repo / "a.py").write_text("x = 1  # FIXME-STELLA\n")

    refused = stella("commit", "-m", "Add a", "a.py", cwd=git_repo, env=ctx.to_env())

    assert refused.returncode == 1, refused.stderr
    first = refused.stderr.splitlines()[0]
    assert first.startswith(
        "stella: error: pre-commit hook refused: no FIXME-STELLA markers failed (exit status 1)"
    )
    assert "rewrote" not in refused.stderr  # no file changed
    assert "no FIXME-STELLA markers" in refused.stderr and "a.py:1:x = 1  # FIXME-STELLA" in refused.stderr
    assert head(git_repo) == before
    (git_repo / "a.py").write_text("x = 1\n")
    done = stella("commit", "-m", "Add a", "a.py", cwd=git_repo, env=ctx.to_env())
    assert done.returncode == 0, done.stderr
    assert git("show", "HEAD:a.py", cwd=git_repo) == "x = 1\n"


def test_a_hook_that_rewrites_a_file_fails_the_commit_and_leaves_the_file_rewritten(
    git_repo: Path, stella: StellaRunner
) -> None:
    install_pre_commit(git_repo)
    ctx = make_attempt(git_repo)
    before = head(git_repo)
    (git_repo / "b.txt").write_text("trailing   \n")

    refused = stella("commit", "-m", "Add b", "b.txt", cwd=git_repo, env=ctx.to_env())

    assert refused.returncode == 1
    assert "files were modified by this hook" in refused.stderr
    assert "The hook rewrote b.txt: the rewrite stays in the work tree" in refused.stderr
    assert head(git_repo) == before
    assert (git_repo / "b.txt").read_text() == "trailing\n"  # the fixer's work stays for the agent
    again = stella("commit", "-m", "Add b", "b.txt", cwd=git_repo, env=ctx.to_env())
    assert again.returncode == 0, again.stderr
    assert git("show", "HEAD:b.txt", cwd=git_repo) == "trailing\n"


def test_hooks_skip_commits_without_running_them(git_repo: Path, stella: StellaRunner) -> None:
    install_pre_commit(git_repo)
    ctx = make_attempt(git_repo)
    (git_repo / "a.py").write_text("x = 1  # FIXME-STELLA\n")
    env = {**ctx.to_env(), "STELLA_COMMIT_HOOKS": "skip"}
    done = stella("commit", "-m", "Add a", "a.py", cwd=git_repo, env=env)
    assert done.returncode == 0, done.stderr
    assert "FIXME-STELLA" in git("show", "HEAD:a.py", cwd=git_repo)


@pytest.mark.parametrize("hooks_in", ["commit-tree", "shared-tree"])
def test_a_plain_hook_script_sees_exactly_the_committed_paths_as_staged(
    git_repo: Path, stella: StellaRunner, hooks_in: str
) -> None:
    (git_repo / ".stella").mkdir(exist_ok=True)
    (git_repo / ".stella" / "config.toml").write_text(f'[commit]\nhooks_in = "{hooks_in}"\n')
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text('#!/bin/sh\ngit diff --cached --name-only > "$SEEN"\ngit status --porcelain >> "$SEEN"\n')
    hook.chmod(0o755)
    ctx = make_attempt(git_repo)
    (git_repo / "README.md").write_text("the user's unstaged edit\n")
    (git_repo / "staged.txt").write_text("the user's staged file\n")
    git("add", "staged.txt", cwd=git_repo)
    (git_repo / "mine.txt").write_text("mine\n")
    seen = git_repo.parent / "seen.txt"
    done = stella(
        "commit", "-m", "Add mine", "mine.txt", cwd=git_repo, env={**ctx.to_env(), "SEEN": str(seen)}
    )
    assert done.returncode == 0, done.stderr
    # the hook's git sees the commit (mine.txt) staged, none of the user's changes to tracked files; in the
    # shared tree the user's staged new file is an untracked file to it (as with `git commit mine.txt`), in
    # the commit tree it is not there at all, nor is stella's state
    lines = [line for line in seen.read_text().splitlines() if not line.endswith(".stella/")]
    expected = ["mine.txt", "A  mine.txt"] + (["?? staged.txt"] if hooks_in == "shared-tree" else [])
    assert lines == expected
    assert git("diff", "--cached", "--name-only", cwd=git_repo).split() == ["staged.txt"]


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    target, stop, bad = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    lines = []
    while not stop.exists():
        lines.append(f"line {len(lines)}\\n")
        target.write_text("".join(lines))
        time.sleep(0.003)
        if target.read_text() != "".join(lines):
            bad.write_text(target.read_text())
            break
""")


@pytest.mark.slow
def test_hooks_of_concurrent_commits_in_the_shared_tree_never_touch_another_workers_files(
    git_repo: Path, tmp_path: Path
) -> None:
    install_pre_commit(git_repo)
    (git_repo / "other.txt").write_text("tracked, being rewritten by another worker\n")
    git("add", "other.txt", cwd=git_repo)
    git("commit", "-q", "-m", "other", cwd=git_repo)
    before = head(git_repo)
    stop, bad = tmp_path / "stop", tmp_path / "bad"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(git_repo / "other.txt"), str(stop), str(bad)]
    )
    stella_bin = shutil.which("stella") or ""
    argv = [stella_bin] if stella_bin else [sys.executable, "-m", "stellafleet"]
    commits = []
    try:
        for n in range(4):
            ctx = make_attempt(git_repo, task_id=f"w{n}")
            (git_repo / f"w{n}.txt").write_text(f"worker {n}\n")
            env = {**os.environ, **ctx.to_env(), "SLOW_HOOK_S": "0.5"}
            commits.append(
                subprocess.Popen(
                    [*argv, "commit", "-m", f"w{n}", f"w{n}.txt"],
                    cwd=git_repo,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results = [(*proc.communicate(timeout=120), proc.returncode) for proc in commits]
    finally:
        stop.touch()
        writer.wait(timeout=30)
    assert all(code == 0 for _, _, code in results), results
    assert not bad.exists(), f"another worker's file was changed under it: {bad.read_text()!r}"
    assert git("rev-list", "--count", f"{before}..HEAD", cwd=git_repo).strip() == "4"
    assert sorted(git("diff", "--name-only", before, "HEAD", cwd=git_repo).split()) == [
        f"w{n}.txt" for n in range(4)
    ]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo).split() == ["M", "other.txt"]
    with Ledger.open(git_repo / ".stella" / "private" / "fleet.db", readonly=True) as ledger:
        assert len(ledger.get_run(RUN)["commits"]) == 4


MSG_CONFIG = textwrap.dedent("""\
    repos:
      - repo: local
        hooks:
          - id: no-wip
            name: no WIP commits
            language: pygrep
            entry: ^WIP
            stages: [commit-msg]
""")


def test_the_frameworks_commit_msg_hook_checks_the_message(git_repo: Path, stella: StellaRunner) -> None:
    (git_repo / ".pre-commit-config.yaml").write_text(MSG_CONFIG)
    git("add", ".pre-commit-config.yaml", cwd=git_repo)
    git("commit", "-q", "-m", "pre-commit config", cwd=git_repo)
    install = [sys.executable, "-m", "pre_commit", "install", "--hook-type", "commit-msg"]
    subprocess.run(install, cwd=git_repo, check=True, capture_output=True)
    ctx = make_attempt(git_repo)
    before = head(git_repo)
    (git_repo / "c.txt").write_text("c\n")

    refused = stella("commit", "-m", "WIP: add c", "c.txt", cwd=git_repo, env=ctx.to_env())

    assert refused.returncode == 1
    assert refused.stderr.startswith("stella: error: commit-msg hook refused: no WIP commits failed")
    assert head(git_repo) == before
    done = stella("commit", "-m", "Add c", "c.txt", cwd=git_repo, env=ctx.to_env())
    assert done.returncode == 0, done.stderr
    assert git("log", "-1", "--format=%s", cwd=git_repo).strip() == "Add c"


def test_the_framework_runs_on_a_path_that_starts_with_a_dash(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    # `pre-commit run --files -x.txt` took "-x.txt" for an option and refused the whole run (a usage
    # error), failing every commit of such a file; `git commit -- -x.txt` runs the framework's hooks on it.
    seen = tmp_path / "seen"
    config = textwrap.dedent("""\
        repos:
          - repo: local
            hooks:
              - id: record
                name: record the files
                language: system
                entry: sh -c 'printf "%s\\n" "$@" > "$SEEN"' --
        """)
    (git_repo / ".pre-commit-config.yaml").write_text(config)
    git("add", ".pre-commit-config.yaml", cwd=git_repo)
    git("commit", "-q", "-m", "pre-commit config", cwd=git_repo)
    subprocess.run(
        [sys.executable, "-m", "pre_commit", "install"], cwd=git_repo, check=True, capture_output=True
    )
    ctx = make_attempt(git_repo)
    (git_repo / "-x.txt").write_text("dash\n")

    done = stella(
        "commit", "-m", "Add -x", "--", "-x.txt", cwd=git_repo, env={**ctx.to_env(), "SEEN": str(seen)}
    )

    assert done.returncode == 0, done.stderr
    assert seen.read_text() == "-x.txt\n"  # the hook ran on the file, as for git commit
    assert git("show", "HEAD:-x.txt", cwd=git_repo) == "dash\n"


COMMITLINT = """#!/bin/sh
echo '⧗   input: '
echo '✖   subject may not be empty [subject-empty]'
echo '✖   type may not be empty [type-empty]'
echo
echo '✖   found 2 problems, 0 warnings'
echo 'husky - commit-msg script failed (code 1)'
exit 1
"""


def test_a_refused_commit_names_the_hook_and_the_first_error_line_it_printed(
    git_repo: Path, stella: StellaRunner
) -> None:
    hook = git_repo / ".git" / "hooks" / "commit-msg"
    hook.write_text(COMMITLINT)
    hook.chmod(0o755)
    ctx = make_attempt(git_repo)
    (git_repo / "c.txt").write_text("c\n")
    refused = stella("commit", "-m", ": ", "c.txt", cwd=git_repo, env=ctx.to_env())
    assert refused.returncode == 1
    lines = refused.stderr.splitlines()
    assert lines[0] == (
        "stella: error: commit-msg hook refused: subject may not be empty [subject-empty] (exit status 1); "
        "nothing was committed. It said:"
    )
    assert lines[-1] == "Fix what it reports and run stella commit again."  # no file changed: no rewrite hint
