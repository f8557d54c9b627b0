"""A typed monorepo's hooks with shared tasks at full concurrency: a pre-commit hook that refuses to commit
while `git ls-files --others --exclude-standard` lists anything (zod's) and a check of the whole package.
Six shared workers each leave an unfinished file in the shared tree and commit at once: in the commit tree
every hook sees exactly its commit, so all six commit."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner, git

HOOK = """#!/bin/sh
untracked=$(git ls-files --others --exclude-standard)
if [ -n "$untracked" ]; then echo "error: commit or remove the untracked files first:" $untracked; exit 1; fi
for f in pkg/*.ts; do
  grep -q '^export' "$f" || { echo "error: type check: $f: not a module"; exit 1; }
done
"""
WORKERS = 6
WORKER = f"""
(WS / "pkg" / f"{{TASK}}.ts").write_text(f"export const {{TASK}} = 1;\\n")
(WS / "pkg" / f"{{TASK}}-wip.ts").write_text("half written\\n")  # unfinished: never committed
mark(f"ready-{{TASK}}")
for n in range({WORKERS}):
    wait_file(MARKS / f"ready-t{{n}}")
stella_commit(f"Add {{TASK}}", f"pkg/{{TASK}}.ts")
mark(f"committed-{{TASK}}")
for n in range({WORKERS}):
    wait_file(MARKS / f"committed-t{{n}}")
(WS / "pkg" / f"{{TASK}}-wip.ts").unlink()
report(summary="added")
"""


def test_six_shared_workers_commit_at_once_under_whole_tree_hooks(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("worker", WORKER))
    (git_repo / "pkg").mkdir()
    (git_repo / "pkg" / "index.ts").write_text("export {};\n")
    git("add", "pkg", cwd=git_repo)
    git("commit", "-q", "-m", "package", cwd=git_repo)
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    plan = tmp_path / "plan.toml"
    plan.write_text("".join(f'[[tasks]]\nid = "t{n}"\nprompt = "add t{n}"\n\n' for n in range(WORKERS)))
    marks = tmp_path / "marks"
    marks.mkdir()

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", str(WORKERS),
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the one line at the start: the user's own commits are not in the commit tree
    assert "your own `git commit` during the run runs the pre-commit hook in the shared tree" in proc.stderr
    record = run_record(git_repo)
    assert sorted(c["message"] for c in record["commits"]) == [f"Add t{n}" for n in range(WORKERS)]
    committed = git("ls-tree", "--name-only", "HEAD", "pkg/", cwd=git_repo).split()
    assert committed == ["pkg/index.ts", *(f"pkg/t{n}.ts" for n in range(WORKERS))]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
