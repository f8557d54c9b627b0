"""Private-index plumbing for the commit lane: a commit of exactly some paths never reads the user's index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops


def with_index(index_file: Path) -> dict[str, str]:
    """The environment that points git at index_file instead of the work tree's index."""
    return {"GIT_INDEX_FILE": str(index_file)}


def read_tree_into(root: Path, index_file: Path, commit: str | None) -> None:
    """Seed index_file with commit's tree (an empty index when commit is None: an unborn branch)."""
    args = ["read-tree", commit] if commit else ["read-tree", "--empty"]
    gitops.git(*args, cwd=root, env=with_index(index_file))


def _update_paths(root: Path, index_file: Path, paths: Sequence[str], *options: str) -> None:
    """`git update-index OPTIONS` on each of paths in index_file."""
    stdin = "".join(f"{path}\0" for path in paths)
    gitops.git("update-index", *options, "-z", "--stdin", cwd=root, env=with_index(index_file), stdin=stdin)


def stage_paths(root: Path, index_file: Path, paths: Sequence[str]) -> None:
    """Put the work tree's version of each path into index_file; a path missing on disk is removed."""
    _update_paths(root, index_file, paths, "--add", "--remove")


def write_tree(root: Path, index_file: Path) -> str:
    return gitops.git("write-tree", cwd=root, env=with_index(index_file)).strip()


def tree_of(root: Path, commit: str) -> str:
    return gitops.git("rev-parse", f"{commit}^{{tree}}", cwd=root).strip()


def commit_tree(
    root: Path, tree: str, *parents: str | None, message: str, env: Mapping[str, str] | None = None
) -> str:
    """A commit object for tree on parents (None ones left out), by the user's identity or env's; its SHA."""
    args = ["commit-tree", tree, *(arg for parent in parents if parent for arg in ("-p", parent)), "-F", "-"]
    stdin = message if message.endswith("\n") else message + "\n"
    return gitops.git(*args, cwd=root, env=env, stdin=stdin).strip()


class HeadMove:
    """A compare-and-swap of HEAD, its `git update-ref --stdin` started ahead so that under index.lock
    only the move itself is left."""

    def __init__(self, root: Path, reflog_message: str) -> None:
        self.root = root
        self._git = gitops.git_started("update-ref", "-m", reflog_message, "--stdin", cwd=root)

    def move(self, new: str, old: str | None) -> None:
        """HEAD to new only if it is still old (None: no commit yet); GitError otherwise. Used up."""
        done = self._git.finish(f"update HEAD {new} {old or '0' * len(new)}\n")
        if done.returncode != 0:
            now = gitops.ref_commit(self.root, "HEAD")
            raise GitError(
                f"HEAD moved while committing (expected {(old or 'no commit')[:12]}, found "
                f"{(now or 'no commit')[:12]}); nothing was committed: try again "
                f"({gitops.last_words(done.stderr, done.returncode)})"
            )

    def cancel(self) -> None:
        """Let it end without moving anything (no input)."""
        self._git.finish()


def _records(records: list[str]) -> Iterator[tuple[list[str], str]]:
    """(the fields before the tab, the path) of each record of a `-z` listing (ls-tree, ls-files -s)."""
    for record in records:
        meta, path = record.split("\t", 1)
        yield meta.split(), path


def tree_entries(root: Path, commit: str, paths: Sequence[str]) -> dict[str, tuple[str, str]]:
    """path -> (mode, object SHA) for those of paths present in commit's tree."""
    out = gitops.git_fields("ls-tree", "-z", "--full-tree", commit, "--", *paths, cwd=root)
    return {path: (mode, sha) for (mode, _kind, sha), path in _records(out)}


def set_entries(
    root: Path, index_file: Path, entries: Mapping[str, tuple[str, str]], removed: Sequence[str]
) -> None:
    """Set exactly these entries of index_file (mode, object SHA) and remove the removed paths."""
    lines = "".join(f"{mode} {sha}\t{path}\0" for path, (mode, sha) in entries.items())
    if lines:
        gitops.git("update-index", "-z", "--index-info", cwd=root, env=with_index(index_file), stdin=lines)
    if removed:
        _update_paths(root, index_file, removed, "--force-remove")


def file_entries(root: Path, index_file: Path, paths: Sequence[str]) -> dict[str, tuple[str, str]]:
    """path -> (mode, object SHA) of those of paths index_file holds (stage 0): paths, not patterns (`a*.txt`
    is that file, not ab.txt too)."""
    args = ("--literal-pathspecs", "ls-files", "-s", "-z", "--", *paths)
    out = gitops.git_fields(*args, cwd=root, env=with_index(index_file))
    return {path: (mode, sha) for (mode, sha, stage), path in _records(out) if stage == "0"}


def hide_others(root: Path, index_file: Path, paths: Sequence[str]) -> None:
    """Mark every entry of index_file but paths skip-worktree: git diff and status see only paths."""
    keep = set(paths)
    listed = gitops.git_fields("ls-files", "-z", cwd=root, env=with_index(index_file))
    others = [path for path in listed if path not in keep]
    if others:
        _update_paths(root, index_file, others, "--skip-worktree")
