"""The commit tree: a shared commit's hooks run in a kept tree of the repository (keptree.py, at
`.stella/private/commit/tree`) that holds exactly the commit, the branch's tip plus the task's staged
paths, so that a hook sees no untracked file of anyone, no other worker's edit and no stella state
(docs/claims.md). What the hooks stage lands in the commit, and is written back to the shared tree where
the file there is still what the worker committed."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, hooks, hookstash, index
from stellafleet.git.keptree import KeptTree

HOOKS_IN_COMMIT_TREE = "commit-tree"  # [commit] hooks_in; "shared-tree": in the shared tree, as before
Entries = Mapping[str, tuple[str, str]]  # path -> (mode, object SHA)


def tree_path(root: Path) -> Path:
    """Where root's commit tree is kept (its lock and markers beside it): in stella's private state, which
    git ignores."""
    return StatePaths(root).private / "commit" / "tree"


def log_path(root: Path) -> Path:
    """Where the commit tree's readying (its `[worktree] setup`) writes."""
    return StatePaths(root).private / "logs" / "commit-tree.log"


@dataclass(frozen=True)
class Hooked:
    """What the hooks made of a commit: its paths' entries and message, and what the hooks rewrote (and
    staged) of the worker's files, to write back once the commit lands."""

    entries: Entries
    message: str
    rewrites: Mapping[str, bytes]


def run_hooks(
    kept: KeptTree,
    head: str,
    worker: Entries,
    paths: Sequence[str],
    message: str,
    scratch: Path,
    *,
    installed: hooks.Installed,
    hook_lock: Path | None,
    workspace: Path,
) -> Hooked:
    """The pre-commit and commit-msg hooks (of installed) run in the commit tree moved to head with the
    worker's entries of paths staged and written; HookFailed when one refuses, or when the pre-commit hook
    rewrote a committed file without staging it (those rewrites then go back to workspace, to be taken
    by the next commit, as in the shared tree)."""
    with kept.held():
        try:
            moved = kept.move_to(head)
        except StellaError as exc:  # its setup failed: no hook can run, nothing is committed
            raise StellaError(
                f"the commit tree {kept.path} could not be readied ({exc}; its log: {log_path(kept.root)}); "
                "nothing was committed",
                exit_code=1,
            ) from None
        if moved.redone:
            print(
                "stella: the commit tree was left half moved by a killed stella commit: moved again",
                file=sys.stderr,
            )
        tree, git_dir = kept.path, kept.git_dir
        index_file = git_dir / "index" if git_dir else gitops.git_path(tree, "--git-path", "index")
        _put(tree, index_file, worker, paths)
        where = installed.in_tree(tree)
        with hookstash.guarded(hook_lock, tree):
            if "pre-commit" in installed:
                try:
                    hooks.run_pre_commit(tree, index_file, paths, where, others_hidden=False)
                except hooks.HookFailed as refused:
                    said = write_back(workspace, _rewritten(tree, worker), worker)
                    raise hooks.HookFailed("\n".join([str(refused), *said])) from None
            entries = index.file_entries(tree, index_file, paths)
            now = _file_shas(tree, [path for path, (mode, _sha) in worker.items() if mode.startswith("100")])
            unstaged = sorted(
                path for path, sha in now.items() if path in entries and sha != entries[path][1]
            )
            if unstaged:
                said = write_back(workspace, _rewritten(tree, worker), worker)
                raise hooks.HookFailed(
                    f"stella: error: pre-commit hook rewrote {', '.join(unstaged)} without staging it; "
                    "nothing was committed. The rewrite is in your tree: commit again to take it (a hook "
                    "that stages what it rewrites, as lint-staged does, puts it in the commit)."
                    + "".join(f"\n{line}" for line in said)
                )
            if "commit-msg" in installed:
                message = hooks.run_commit_msg(tree, index_file, message, scratch, paths, where)
        rewrites = {path: (tree / path).read_bytes() for path, sha in now.items() if sha != worker[path][1]}
        return Hooked(entries, message, rewrites)


def _put(tree: Path, index_file: Path, worker: Entries, paths: Sequence[str]) -> None:
    """The worker's entries of paths staged in the tree's index and written to its files (paths without
    one deleted), as `git add PATH...` would leave them."""
    gone = [path for path in paths if path not in worker]
    index.set_entries(tree, index_file, worker, gone)
    if worker:
        stdin = "".join(f"{path}\0" for path in worker)
        gitops.git(
            "checkout-index",
            "-f",
            "-q",
            "-z",
            "--stdin",
            cwd=tree,
            env=index.with_index(index_file),
            stdin=stdin,
        )
    for path in gone:
        (tree / path).unlink(missing_ok=True)


def _file_shas(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """path -> the object SHA of its file in root, for those of paths that are regular files."""
    files = [path for path in paths if (root / path).is_file() and not (root / path).is_symlink()]
    if not files:
        return {}
    stdin = "".join(f"{path}\n" for path in files)
    return dict(
        zip(files, gitops.git("hash-object", "--stdin-paths", cwd=root, stdin=stdin).split(), strict=True)
    )


def _rewritten(tree: Path, entries: Entries) -> dict[str, bytes]:
    """What the tree's files hold where they differ from entries (regular files only)."""
    shas = _file_shas(tree, [path for path, (mode, _sha) in entries.items() if mode.startswith("100")])
    return {path: (tree / path).read_bytes() for path, sha in shas.items() if sha != entries[path][1]}


def write_back(workspace: Path, rewrites: Mapping[str, bytes], worker: Entries) -> list[str]:
    """Each rewrite written to its file in workspace when that file is still what the worker committed,
    left alone when the worker changed it since: one line each, either way, to say."""
    said = []
    now = _file_shas(workspace, list(rewrites)) if rewrites else {}
    for path, content in rewrites.items():
        if now.get(path) == worker[path][1]:
            _replace(workspace / path, content)
            said.append(f"stella: {path}: the hook's rewrite is in your tree too")
        else:
            said.append(f"stella: {path}: the hook rewrote it, but it changed in your tree since: left alone")
    return said


def _replace(path: Path, content: bytes) -> None:
    """path's content replaced at once (a kill leaves the old file or the new one), its mode kept."""
    aside = path.with_name(f".{path.name}.stella-{os.getpid()}")
    aside.write_bytes(content)
    shutil.copymode(path, aside)
    os.replace(aside, path)
