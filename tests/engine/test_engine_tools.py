"""The engine's tools on a real repository: confinement, edits, search, commits, the shell switch."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.agents import make_context
from helpers.engine import make_repo

from stellafleet.engine.errors import Finished, FormatError, ToolFailure
from stellafleet.engine.tools import LeaveOpen, Toolbox, Workspace
from stellafleet.git import gitops
from stellafleet.pipelines.plain import _write_spans
from stellafleet.state.claims import ClaimStore


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "repo")
    (root / "link").symlink_to("/etc")
    (root / "passwd-link").symlink_to("/etc/passwd")
    (root / "inner-link").symlink_to("src")
    return root


def toolbox(root: Path, **kwargs: Any) -> Toolbox:
    commits: list[tuple[list[str], str]] = []

    def committer(paths: list[str], message: str) -> str:
        commits.append((paths, message))
        return "0123456789abcdef0123"

    box = Toolbox(Workspace(root), committer=committer, env={"PATH": os.environ["PATH"]}, **kwargs)
    box.commits = commits  # type: ignore[attr-defined]
    return box


ESCAPES = ["../x", "/etc/passwd", "link/passwd", "passwd-link", "src/../../x", "~/x"]

PATH_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {}),
    ("write_file", {"content": "pwned\n"}),
    ("edit_file", {"old_text": "root", "new_text": "toor"}),
    ("list_dir", {}),
    ("glob", {"pattern": "*"}),
    ("grep", {"pattern": "root"}),
    ("git_diff", {}),
]


@pytest.mark.parametrize("escape", ESCAPES)
@pytest.mark.parametrize(("tool", "extra"), PATH_CALLS)
def test_every_file_tool_refuses_paths_outside_the_workspace(
    repo: Path, tool: str, extra: dict[str, Any], escape: str
) -> None:
    outside = repo.parent / "x"
    box = toolbox(repo)
    with pytest.raises(ToolFailure) as refused:
        box.call(tool, {"path": escape, **extra})
    assert any(word in str(refused.value) for word in ("absolute", "climbs out", "symlink")), refused.value
    assert not outside.exists()
    assert Path("/etc/passwd").read_text().startswith("root")


@pytest.mark.parametrize("escape", ESCAPES)
def test_commit_and_glob_patterns_refuse_escapes_too(repo: Path, escape: str) -> None:
    box = toolbox(repo)
    with pytest.raises(ToolFailure):
        box.call("commit", {"message": "m", "paths": [escape]})
    if not escape.startswith(("link", "passwd")):  # a pattern is not followed through symlinks
        with pytest.raises(ToolFailure):
            box.call("glob", {"pattern": escape})
    assert box.commits == []  # type: ignore[attr-defined]


def test_symlinks_inside_the_workspace_are_fine(repo: Path) -> None:
    box = toolbox(repo)
    assert "return 41" in box.call("read_file", {"path": "inner-link/app.py"})
    box.call("write_file", {"path": "inner-link/new.py", "content": "x = 1\n"})
    assert (repo / "src/new.py").read_text() == "x = 1\n"
    assert list(box.workspace.written) == ["src/new.py"]  # recorded (and claimed) under its real path


def test_writes_into_git_and_stella_state_are_refused(repo: Path) -> None:
    box = toolbox(repo)
    for path in (".git/config", ".stella/private/fleet.db", "src"):
        with pytest.raises(ToolFailure):
            box.call("write_file", {"path": path, "content": "x"})


def test_read_file_numbers_lines_and_pages(repo: Path) -> None:
    (repo / "long.txt").write_text("".join(f"l{n}\n" for n in range(1, 3001)))
    box = toolbox(repo)
    first = box.call("read_file", {"path": "long.txt"})
    assert first.splitlines()[0] == "     1\tl1"
    assert first.endswith("(lines 1-2000 of 3000; read on with start_line=2001)")
    tail = box.call("read_file", {"path": "long.txt", "start_line": 2999})
    assert tail.splitlines()[:2] == ["  2999\tl2999", "  3000\tl3000"]
    (repo / "wide.txt").write_text("".join(f"{n:<99}\n" for n in range(1, 1001)))  # 100 KB
    wide = box.call("read_file", {"path": "wide.txt"})
    assert len(wide) < 30_000 and wide.endswith("(lines 1-278 of 1000; read on with start_line=279)")
    (repo / "blob.bin").write_bytes(b"\0\1\2")
    assert "binary file" in box.call("read_file", {"path": "blob.bin"})
    with pytest.raises(ToolFailure, match="no such file"):
        box.call("read_file", {"path": "missing.txt"})


def test_edit_file_fails_clearly_when_text_is_missing_or_ambiguous(repo: Path) -> None:
    (repo / "dup.py").write_text("x = 1\nx = 1\n")
    box = toolbox(repo)
    with pytest.raises(ToolFailure, match=r"was not found in dup\.py"):
        box.call("edit_file", {"path": "dup.py", "old_text": "y = 2", "new_text": "y = 3"})
    with pytest.raises(ToolFailure, match=r"occurs 2 times in dup\.py"):
        box.call("edit_file", {"path": "dup.py", "old_text": "x = 1", "new_text": "x = 2"})
    assert (repo / "dup.py").read_text() == "x = 1\nx = 1\n"
    assert box.workspace.written == {}
    assert "replaced 2 occurrences" in box.call(
        "edit_file", {"path": "dup.py", "old_text": "x = 1", "new_text": "x = 2", "replace_all": "true"}
    )
    assert (repo / "dup.py").read_text() == "x = 2\nx = 2\n"


def test_glob_and_grep_see_tracked_and_new_files_but_not_ignored_ones(repo: Path) -> None:
    (repo / ".gitignore").write_text("build/\n")
    (repo / "build").mkdir()
    (repo / "build/gen.py").write_text("def answer(): pass\n")
    (repo / "src/new.py").write_text("def answer_two():\n    return 2\n")
    box = toolbox(repo)
    assert box.call("glob", {"pattern": "**/*.py"}).splitlines() == ["src/app.py", "src/new.py"]
    assert box.call("glob", {"pattern": "*.py", "path": "src"}).splitlines() == ["src/app.py", "src/new.py"]
    assert box.call("glob", {"pattern": "*.rs"}) == "no files match *.rs"
    hits = box.call("grep", {"pattern": "def answer"}).splitlines()
    assert hits == ["src/app.py:1:def answer():", "src/new.py:1:def answer_two():"]
    assert (
        box.call("grep", {"pattern": "ANSWER_TWO", "ignore_case": True}) == "src/new.py:1:def answer_two():"
    )
    assert box.call("grep", {"pattern": "answer(", "fixed_strings": True, "include": "*.py"}).count("\n") == 0
    assert box.call("grep", {"pattern": "nothing-like-this"}) == "no matches"
    (repo / "src/app.py").unlink()
    assert box.call("glob", {"pattern": "src/*"}).splitlines() == ["src/new.py"]
    with pytest.raises(Exception, match="git grep"):
        box.call("grep", {"pattern": "("})


def test_commit_only_takes_files_this_worker_wrote(repo: Path) -> None:
    box = toolbox(repo)
    with pytest.raises(ToolFailure, match="nothing to commit"):
        box.call("commit", {"message": "m"})
    box.call("write_file", {"path": "a.txt", "content": "a\n"})
    with pytest.raises(ToolFailure, match=r"README\.md is not one"):
        box.call("commit", {"message": "m", "paths": ["README.md", "a.txt"]})
    assert box.call("commit", {"message": "add a"}).startswith("committed 0123456789ab: a.txt")
    assert box.commits == [(["a.txt"], "add a")]  # type: ignore[attr-defined]
    assert box.workspace.uncommitted == {}


def test_argument_checks(repo: Path) -> None:
    box = toolbox(repo)
    with pytest.raises(FormatError, match="must be a JSON object, not an array"):
        box.call("read_file", ["README.md"])
    with pytest.raises(FormatError, match="unknown argument 'file'"):
        box.call("read_file", {"file": "README.md"})
    with pytest.raises(FormatError, match="'replace_all' must be a boolean, got a number"):
        box.call("edit_file", {"path": "README.md", "old_text": "a", "new_text": "b", "replace_all": 3})
    with pytest.raises(Finished) as finished:
        box.call("finish", {"summary": " all done ", "success": False})
    assert (finished.value.summary, finished.value.success) == ("all done", False)


def test_no_whole_tree_git_tool_and_the_shell_is_off_by_default(repo: Path) -> None:
    names = set(toolbox(repo).tools)
    assert names == {
        "read_file", "write_file", "edit_file", "list_dir", "glob", "grep",
        "git_status", "git_diff", "commit", "finish", "ask",
    }  # fmt: skip
    with pytest.raises(FormatError, match="unknown tool 'shell'"):
        toolbox(repo).call("shell", {"command": "echo hi"})


def test_the_shell_when_enabled_runs_in_the_workspace_without_provider_keys(repo: Path) -> None:
    box = Toolbox(
        Workspace(repo),
        shell=True,
        env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": "sk-test-SECRET-1234567890"},
    )
    out = box.call("shell", {"command": 'pwd; echo "key=${OPENAI_API_KEY:-none}"; exit 3'})
    assert out.splitlines() == ["exit status 3", str(repo.resolve()), "key=none"]


def test_a_shell_command_past_its_timeout_is_stopped_with_everything_it_started(
    repo: Path, tmp_path: Path
) -> None:
    # Only /bin/sh used to be killed: its children (a test runner, a server, a plain `sleep`) lived on.
    box = Toolbox(Workspace(repo), shell=True, shell_timeout=1, env={"PATH": os.environ["PATH"]})
    pid_file = tmp_path / "child.pid"
    with pytest.raises(ToolFailure, match="ran longer than 1 s"):
        box.call("shell", {"command": f"sleep 60 & echo $! > {pid_file}; wait"})
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child), "the shell's child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_grep_does_not_follow_symlinks_out_of_the_workspace(repo: Path) -> None:
    box = toolbox(repo)
    assert box.call("grep", {"pattern": "root:"}) == "no matches"


def test_git_status_and_diff(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "plain")
    box = toolbox(repo)
    assert box.call("git_status", {}) == "clean: nothing to commit"
    box.call("edit_file", {"path": "src/app.py", "old_text": "41", "new_text": "42"})
    assert box.call("git_status", {}) == " M src/app.py"
    assert "+    return 42" in box.call("git_diff", {"path": "src/app.py"})
    assert box.call("git_diff", {"staged": True}) == "no differences"
    assert gitops.status_porcelain(repo) == [" M src/app.py"]


def test_every_call_of_a_tool_that_can_write_is_a_write_span_and_no_other(repo: Path) -> None:
    """A shared tree's writes are attributed by these spans (run/steps/unclaimed.py): each call of
    write_file, edit_file, commit and shell is one, closed when the call ends, failed or not."""
    spans: list[str] = []

    @contextlib.contextmanager
    def span() -> Iterator[LeaveOpen]:
        spans.append("open")
        try:
            yield lambda: spans.append("left open")
        finally:
            spans.append("closed")

    box = toolbox(repo, shell=True)
    box.workspace.span = span
    box.call("write_file", {"path": "notes.md", "content": "one\n"})
    box.call("edit_file", {"path": "notes.md", "old_text": "one", "new_text": "two"})
    box.call("commit", {"message": "notes"})
    box.call("shell", {"command": "true"})
    with pytest.raises(ToolFailure):
        box.call("edit_file", {"path": "notes.md", "old_text": "absent", "new_text": "x"})
    assert spans == ["open", "closed"] * 5
    for name, args in (
        ("read_file", {"path": "notes.md"}),
        ("list_dir", {}),
        ("glob", {"pattern": "*.md"}),
        ("grep", {"pattern": "two"}),
        ("git_status", {}),
        ("git_diff", {}),
    ):
        box.call(name, args)
    assert len(spans) == 10  # reading is no span


def test_a_shell_command_that_leaves_a_process_running_leaves_its_span_open(git_repo: Path) -> None:
    """What a command starts in the background (`server >log &`) may write after the call returned: its
    span stays open, to the attempt's end; one whose processes all ended is closed."""
    ctx = make_context(git_repo, pipeline="plain")
    box = toolbox(git_repo, shell=True)
    box.workspace.span = _write_spans(ctx)
    assert (
        box.call("shell", {"command": "sleep 0.2 >/dev/null 2>&1 & echo started"}) == "exit status 0\nstarted"
    )
    assert box.call("shell", {"command": "sleep 0.01; true"}) == "exit status 0"
    with ClaimStore.open(ctx.paths.store_db) as store:
        spans = store.write_spans(ctx.run_id, ctx.attempt_id) or []
    assert [end is None for _, end in spans] == [True, False]
