"""Many shared-tree workers committing at once through `stella commit` and the commit lane."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import Scripts, file_locks, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops

WORKERS = 16

COMMITTER = """\
out = WS / "out"
out.mkdir(exist_ok=True)
(out / f"{TASK}.txt").write_text(f"written by {TASK}\\n")
sha = stella_commit(f"{TASK}: add out/{TASK}.txt", f"out/{TASK}.txt")
report(summary=f"committed {sha[:12]}")
"""


@pytest.mark.slow
def test_sixteen_shared_workers_commit_concurrently_into_a_linear_history_of_their_own_files(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    write_config(git_repo, run=scripts.python("commit", COMMITTER))
    git("add", ".stella/config.toml", cwd=git_repo)
    git("commit", "-q", "-m", "stella config", cwd=git_repo)
    base = gitops.head_commit(git_repo)
    # The user's own work in progress: an unstaged edit, a staged new file and an untracked file.
    (git_repo / "README.md").write_text("# test repository\nmy unstaged edit\n")
    (git_repo / "staged.txt").write_text("staged by me\n")
    git("add", "staged.txt", cwd=git_repo)
    (git_repo / "notes.txt").write_text("untracked notes\n")
    status_before = git("status", "--porcelain", cwd=git_repo)

    prompts = [f"write file number {n}" for n in range(1, WORKERS + 1)]
    proc = stella_main(
        "fleet",
        "--pipeline",
        "command",
        "--max-concurrency",
        str(WORKERS),
        *prompts,
        cwd=git_repo,
        timeout=300,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert len(record["tasks"]) == WORKERS and {t["wave"] for t in record["tasks"]} == {1}
    history = git("rev-list", "--parents", f"{base}..HEAD", cwd=git_repo).splitlines()
    assert len(history) == WORKERS
    assert all(len(line.split()) == 2 for line in history), "history is not linear"
    assert git("rev-list", "--count", f"{base}..HEAD", cwd=git_repo).strip() == str(WORKERS)

    commits = record["commits"]
    assert len(commits) == WORKERS
    assert {c["sha"] for c in commits} == {line.split()[0] for line in history}
    assert sorted(c["task_id"] for c in commits) == sorted(f"t{n}" for n in range(1, WORKERS + 1))
    attempt_of = {a["task_id"]: a["id"] for a in record["attempts"]}
    for commit in commits:
        task = commit["task_id"]
        assert commit["attempt_id"] == attempt_of[task]
        assert commit["branch"] == "main"
        files = git("show", "--name-only", "--format=", commit["sha"], cwd=git_repo).split()
        assert files == [f"out/{task}.txt"], f"{task}'s commit holds {files}"

    # the user's changes: untouched, and still exactly as staged/unstaged as before
    assert (git_repo / "README.md").read_text() == "# test repository\nmy unstaged edit\n"
    assert git("status", "--porcelain", cwd=git_repo) == status_before
    assert git("diff", "--cached", "--name-only", cwd=git_repo).split() == ["staged.txt"]
    assert git("diff", "--name-only", cwd=git_repo).split() == ["README.md"]
    assert file_locks(git_repo) == []
