"""After a fleet run, `git status` shows of `.stella/` only the project's settings (`.stella/config.toml`,
until committed or ignored): stella's own state (ledger, logs, worktrees) is in `.git/info/exclude`."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import write_config
from helpers.repo import StellaRunner, git


def test_git_status_lists_the_config_and_nothing_else_of_stella_after_a_run(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="echo worked")
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "mine"\nprompt = "p"\nisolation = "isolated"\n\n'
        '[[tasks]]\nid = "ours"\nprompt = "p"\nisolation = "shared"\n'
    )
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (git_repo / ".stella" / "private" / "fleet.db").is_file()
    assert any((git_repo / ".stella" / "worktrees").iterdir())  # the isolated task's worktree is kept
    shown = git("status", "--porcelain", "--untracked-files=all", cwd=git_repo).splitlines()
    assert shown == ["?? .stella/config.toml"]
    assert git("status", "--porcelain", cwd=git_repo).splitlines() == ["?? .stella/"]  # as the README says
