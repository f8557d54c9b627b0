"""--allow-dirty with files git cannot merge as text: a binary file the user had changed when the run
started is committed with the worker's whole file only once the user's version is HEAD's (they committed
it), else its commit is refused in one line naming it; a non-UTF-8 text file is merged as bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.fleet import Scripts, run_record, wait_for, write_config
from helpers.repo import StellaRunner, git

PLAN = """\
[[tasks]]
id = "t1"
prompt = "rewrite the file"
claims = ["{path}"]
"""

ORIGINAL = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR original"
USERS = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR the user's"
WORKERS = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR the worker's"

# The worker waits for the test's go (when there is one), writes its version and commits it.
WRITER = """
if os.environ.get("GO"):
    wait_file(os.environ["GO"])
(WS / os.environ["FILE"]).write_bytes(bytes.fromhex(os.environ["CONTENT"]))
out = subprocess.run(["stella", "commit", "-m", "t1", os.environ["FILE"]], capture_output=True, text=True)
Path(os.environ["MARKS"], "commit.err").write_text(out.stderr)
sys.exit(out.returncode)
"""


def _setup(repo: Path, tmp_path: Path, name: str, original: bytes, content: bytes) -> tuple[Path, Path]:
    (repo / name).write_bytes(original)
    git("add", name, cwd=repo)
    git("commit", "-q", "-m", f"add {name}", cwd=repo)
    write_config(repo, run=Scripts(tmp_path / "scripts").python("writer", WRITER))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(path=name))
    marks = tmp_path / "marks"
    marks.mkdir()
    return plan, marks


def _env(marks: Path, name: str, content: bytes, **more: str) -> dict[str, str]:
    return {"MARKS": str(marks), "FILE": name, "CONTENT": content.hex(), **more}


def _show(repo: Path, spec: str) -> bytes:
    return subprocess.run(["git", "show", spec], cwd=repo, capture_output=True, check=True).stdout


def test_a_binary_file_with_the_users_changes_is_refused_at_commit_time_by_name(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan, marks = _setup(git_repo, tmp_path, "logo.png", ORIGINAL, WORKERS)
    (git_repo / "logo.png").write_bytes(USERS)
    users_blob = git("hash-object", "logo.png", cwd=git_repo).strip()
    before = git("rev-parse", "HEAD", cwd=git_repo).strip()

    proc = stella(
        "fleet", "--pipeline", "command", "--allow-dirty", "--plan", str(plan), cwd=git_repo,
        env=_env(marks, "logo.png", WORKERS),
    )  # fmt: skip

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (marks / "commit.err").read_text().splitlines() == [
        "stella: error: cannot commit logo.png with only the worker's changes: it is a binary file, which "
        "git cannot merge, and it had uncommitted changes of yours when the run started (your version: "
        f"blob {users_blob[:12]}); commit your version of it first, then commit the file again, or commit "
        "it yourself with both (`git add logo.png && git commit`)"
    ]
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == before  # nothing committed
    assert _show(git_repo, f"{users_blob}") == USERS  # the user's version is kept in the object store
    assert run_record(git_repo)["commits"] == []


def test_a_binary_file_whose_users_version_was_committed_meanwhile_is_committed_whole(
    git_repo: Path, tmp_path: Path, spawned: list[subprocess.Popen[str]]
) -> None:
    plan, marks = _setup(git_repo, tmp_path, "logo.png", ORIGINAL, WORKERS)
    (git_repo / "logo.png").write_bytes(USERS)
    go = marks / "go"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--pipeline", "command", "--allow-dirty",
         "--plan", str(plan)],
        cwd=git_repo, env={**__import__("os").environ, **_env(marks, "logo.png", WORKERS, GO=str(go))},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    spawned.append(fleet)
    wait_for(git_repo / ".stella" / "private" / "dirty", process=fleet)  # the run noted the user's version
    # the user commits their version while the run goes on; then the worker writes and commits its own
    git("commit", "-q", "-m", "the user's logo", "logo.png", cwd=git_repo)
    users_commit = git("rev-parse", "HEAD", cwd=git_repo).strip()
    go.touch()
    out, err = fleet.communicate(timeout=120)

    assert fleet.returncode == 0, out + err + (marks / "commit.err").read_text()
    assert _show(git_repo, "HEAD:logo.png") == WORKERS
    assert git("rev-parse", "HEAD~1", cwd=git_repo).strip() == users_commit
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""


def test_a_non_utf8_text_file_is_merged_as_bytes(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    original = "caf\xe9 1\nline 2\nline 3\n".encode("latin-1")
    users = "caf\xe9 1, the user's\nline 2\nline 3\n".encode("latin-1")
    workers = users + "na\xefve line 4\n".encode("latin-1")
    plan, marks = _setup(git_repo, tmp_path, "notes.txt", original, workers)
    (git_repo / "notes.txt").write_bytes(users)

    proc = stella(
        "fleet", "--pipeline", "command", "--allow-dirty", "--plan", str(plan), cwd=git_repo,
        env=_env(marks, "notes.txt", workers),
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr + (marks / "commit.err").read_text()
    assert _show(git_repo, "HEAD:notes.txt") == original + "na\xefve line 4\n".encode("latin-1")
    assert (git_repo / "notes.txt").read_bytes() == workers  # the user's edit stays, uncommitted
