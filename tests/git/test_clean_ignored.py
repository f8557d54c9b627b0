"""`stella clean` never deletes work no commit holds: ignored and untracked files in a task's worktree count.

An isolated task wrote a gitignored `local.env` in its worktree; `stella clean` without --force saw a
"clean worktree" (git status hides ignored files) and removed it, and the file with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths

WRITER = """\
Path(WS / "local.env").write_text("API_TOKEN=only-copy\\n")
Path(WS / "scratch.txt").write_text("x")
"""


def test_ignored_and_untracked_files_keep_a_worktree_without_force(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / ".gitignore").write_text("local.env\n")
    git("add", ".gitignore", cwd=git_repo)
    git("commit", "-q", "-m", "ignore local.env", cwd=git_repo)
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("writer", WRITER))
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "env"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (worktree,) = list(StatePaths(git_repo).worktrees.iterdir())
    # scratch.txt was committed for the task (its uncommitted work): only the ignored file is left, which
    # git status calls clean
    assert git("status", "--porcelain", cwd=worktree) == ""

    result = stella("clean", "--json", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    kept = {item["target"]: item["reason"] for item in report["kept"]}
    shown = str(worktree.relative_to(git_repo))
    assert kept[shown].startswith("has uncommitted changes (1 file: local.env)"), report
    assert (worktree / "local.env").read_text() == "API_TOKEN=only-copy\n"

    forced = stella("clean", "--force", "--json", cwd=git_repo)
    assert forced.returncode == 0 and not worktree.exists(), forced.stdout + forced.stderr
