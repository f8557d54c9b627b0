"""`stella clean` judges like git: ignored files never make a worktree dirty, untracked ones do.

A task that ran pytest and ruff left `.pytest_cache/` and `.ruff_cache/` (ignored) in its worktree; clean
called them "uncommitted changes" and kept the worktree and its already-merged branch, where `git status`
is clean and `git worktree remove` succeeds. Untracked, not ignored work still keeps a worktree, and
`--force` prints each deleted branch's tip as `git branch -D` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths

WRITER = """\
for cache in (".pytest_cache", ".ruff_cache"):
    (WS / cache).mkdir()
    (WS / cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\\n")
"""

COMMITTER = """\
Path(WS / "feature.txt").write_text("feature\\n")
subprocess.run(["git", "add", "feature.txt"], cwd=WS, check=True)
subprocess.run(["git", "commit", "-q", "-m", "feature"], cwd=WS, check=True)
"""


def _ignore_caches(root: Path) -> None:
    (root / ".gitignore").write_text(".pytest_cache/\n.ruff_cache/\n")
    git("add", ".gitignore", cwd=root)
    git("commit", "-q", "-m", "ignore caches", cwd=root)


def test_ignored_caches_never_keep_a_worktree_but_untracked_work_does(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    _ignore_caches(git_repo)
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("writer", WRITER))
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "cache"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (worktree,) = list(StatePaths(git_repo).worktrees.iterdir())
    shown = str(worktree.relative_to(git_repo))
    # a succeeded task's own uncommitted work is committed for it (worker/main.py): this file stands
    # for work added to the worktree after the run, which no rule has committed
    (worktree / "scratch.txt").write_text("x")

    kept = json.loads(stella_main("clean", "--json", cwd=git_repo).stdout)["kept"]
    reasons = {item["target"]: item["reason"] for item in kept}
    assert reasons[shown].startswith("has uncommitted changes (1 file: scratch.txt)"), kept

    (worktree / "scratch.txt").unlink()  # only ignored caches are left: git status calls this clean
    assert git("status", "--porcelain", cwd=worktree) == ""
    result = stella_main("clean", "--json", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    removed = {item["target"]: item["reason"] for item in report["removed"]}
    assert removed[shown] == "clean worktree", report
    assert not worktree.exists()
    # its branch (no commits beyond main: merged) went with it, its tip named
    [branch] = [item for item in report["removed"] if item["kind"] == "branch"]
    main = git("rev-parse", "main", cwd=git_repo).strip()
    assert branch["reason"] == f"merged into main (was {main[:7]})"


def test_force_prints_each_deleted_branchs_tip_and_without_it_unmerged_work_stays(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("committer", COMMITTER))
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "feat"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [branch] = [b for b in git("branch", "--format=%(refname:short)", cwd=git_repo).split() if b != "main"]
    tip = git("rev-parse", branch, cwd=git_repo).strip()

    plain = stella_main("clean", cwd=git_repo)
    assert plain.returncode == 0, plain.stderr
    assert f"kept         branch   {branch}" in plain.stdout
    assert "not merged into main (1 commit ahead): merge it, or rerun with --force" in plain.stdout
    assert git("rev-parse", branch, cwd=git_repo).strip() == tip

    forced = stella_main("clean", "--force", cwd=git_repo)
    assert forced.returncode == 0, forced.stderr
    assert f"removed      branch   {branch}" in forced.stdout
    assert f"not merged (1 commit ahead), deleted by --force (was {tip[:7]})" in forced.stdout
    assert git("branch", "--list", branch, cwd=git_repo) == ""


def test_teardown_runs_in_the_worktree_before_clean_removes_it(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    teardown = f'pwd > {marks}/teardown; test -f "$PWD/README.md"; env | grep ^STELLA_ | sort > {marks}/env'
    write_config(git_repo, run="true", extra=f"[worktree]\nteardown = {json.dumps(teardown)}\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "svc"\nprompt = "p"\nisolation = "isolated"\n')
    ran = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (worktree,) = list(StatePaths(git_repo).worktrees.iterdir())

    dry = stella_main("clean", "--dry-run", cwd=git_repo)
    assert dry.returncode == 0 and not (marks / "teardown").exists()  # a dry run runs nothing
    result = stella_main("clean", "--json", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    [item] = [i for i in json.loads(result.stdout)["removed"] if i["kind"] == "worktree"]
    assert item["reason"] == "clean worktree; teardown ran"
    assert Path((marks / "teardown").read_text().strip()).resolve() == worktree.resolve()
    told = dict(line.split("=", 1) for line in (marks / "env").read_text().splitlines())
    # the docs' `docker compose -p app-$STELLA_TASK_ID down -v` tears down the task's own project
    assert told["STELLA_TASK_ID"] == "svc" and told["STELLA_RUN_ID"] == item["run_id"]
    assert Path(told["STELLA_WORKSPACE"]).resolve() == worktree.resolve()
    assert told["STELLA_BRANCH"] == f"fleet/{worktree.name}" and told["STELLA_WORKTREE_INDEX"] == "1"
    assert not worktree.exists()
    log = StatePaths(git_repo).log_file(item["run_id"], "svc").read_text()
    assert f"[stella] teardown: {teardown}" in log and "[stella] teardown done in " in log
