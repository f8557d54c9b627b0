"""Hooks that keep a backup in the stash, lint-staged's way, run one commit at a time across shared and
isolated workers (`[commit] serialize_hooks = "auto"`), through stella commit and an isolated worker's own
git commit alike: six workers all commit, and the user's own stash is exactly as it was."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner, git

# lint-staged's way: a backup stored in the stash, found again by its message, dropped by its place in the
# list (`git stash drop stash@{N}`); a hook that finds none fails as lint-staged does.
HOOK = """#!/bin/sh
set -e
index=$(git commit-tree "HEAD^{tree}" -p HEAD -m index)
backup=$(git commit-tree "HEAD^{tree}" -p HEAD -p "$index" -m backup)
git stash store -m "lint-staged automatic backup" "$backup"
python3 -c 'import time; time.sleep(0.2)'  # the linters' work
at=$(git stash list --format='%gd %gs' | grep -m1 'lint-staged automatic backup' | cut -d' ' -f1)
if [ -z "$at" ]; then echo "lint-staged automatic backup is missing!"; exit 1; fi
git stash drop -q "$at"
"""

SHARED = [f"s{n}" for n in range(4)]
ISOLATED = ["i0", "i1"]
PLAN = "".join(
    f'[[tasks]]\nid = "{t}"\nprompt = "write {t}.txt"\nclaims = ["{t}.txt"]\n\n' for t in SHARED
) + "".join(f'[[tasks]]\nid = "{t}"\nprompt = "write {t}.txt"\nisolation = "isolated"\n\n' for t in ISOLATED)
# shared workers commit with stella commit, isolated ones with their own git commit (as they are told)
WRITER = """
(WS / f"{TASK}.txt").write_text(f"{TASK}\\n")
if os.environ["STELLA_ISOLATION"] == "isolated":
    subprocess.run(["git", "add", f"{TASK}.txt"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", f"{TASK}: write"], check=True)
else:
    stella_commit(f"{TASK}: write", f"{TASK}.txt")
report(summary="written")
"""


def _users_stash(repo: Path) -> None:
    for n in range(2):
        (repo / "user.txt").write_text(f"the user's change {n}\n")
        git("stash", "push", "-q", "-m", f"the user's stash {n}", cwd=repo)


def test_six_workers_with_stash_backup_hooks_all_commit_and_the_users_stash_is_kept(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "user.txt").write_text("original\n")
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("writer", WRITER))
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    _users_stash(git_repo)
    before = git("stash", "list", "--format=%H %gs", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "6", cwd=git_repo
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert {task["status"] for task in record["tasks"]} == {"succeeded"}
    assert sorted(commit["task_id"] for commit in record["commits"]) == sorted(SHARED + ISOLATED)
    assert git("stash", "list", "--format=%H %gs", cwd=git_repo) == before
