"""husky's relative `core.hooksPath = .husky/_` is an ignored folder a new worktree lacks: the worktree gets
the main tree's, so an isolated worker's commit runs the repository's hooks, and the start line says so."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner, git

# husky 9's layout: .husky/_ (ignored, made by `husky` at install) holds a shim per hook that runs h, which
# runs the tracked .husky/<hook> of the tree the hook runs in
SHIM = '#!/usr/bin/env sh\n. "$(dirname "$0")/h"\n'
H = """#!/usr/bin/env sh
n=$(basename "$0")
s=$(dirname "$(dirname "$0")")/$n
[ ! -f "$s" ] && exit 0
sh -e "$s" "$@"
c=$?
[ $c != 0 ] && echo "husky - $n script failed (code $c)"
exit $c
"""
PRE_COMMIT = "if grep -q TODO-HUSKY app.txt; then echo 'no TODO-HUSKY markers'; exit 1; fi\n"

WORKER = """
(WS / "app.txt").write_text("TODO-HUSKY\\n")
out = subprocess.run(["stella", "commit", "-m", "app", "app.txt"], capture_output=True, text=True)
mark("refused", out.stderr)
(WS / "app.txt").write_text("done\\n")
stella_commit("app", "app.txt")
report(summary="app written")
"""


def _husky(repo: Path) -> None:
    (repo / ".husky" / "_").mkdir(parents=True)
    (repo / ".husky" / "pre-commit").write_text(PRE_COMMIT)
    for name, text in ((".gitignore", "*\n"), ("pre-commit", SHIM), ("h", H)):
        (repo / ".husky" / "_" / name).write_text(text)
        (repo / ".husky" / "_" / name).chmod(0o755)
    git("config", "core.hooksPath", ".husky/_", cwd=repo)


def test_an_isolated_workers_commit_runs_the_husky_hooks(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("worker", WORKER))
    _husky(git_repo)
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "--no-verify", "-m", "husky", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "app"\nprompt = "write app.txt"\nisolation = "isolated"\n')
    marks = tmp_path / "marks"
    marks.mkdir()

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo, env={"MARKS": str(marks)}
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stella fleet: isolated tasks' commits run the pre-commit hooks of .husky/_\n" in proc.stderr
    assert "no TODO-HUSKY markers" in (marks / "refused").read_text()
    (commit,) = run_record(git_repo)["commits"]
    assert git("show", f"{commit['sha']}:app.txt", cwd=git_repo) == "done\n"
    worktree = Path(run_record(git_repo)["tasks"][0]["worktree"])
    assert git("status", "--porcelain", cwd=worktree) == ""  # the copied folder is ignored there too
