"""Commit hooks that may use the stash run one commit at a time in a repository (`refs/stash` is one ref for
the main tree and every worktree), and what they leave in the stash is removed: only entries they made
(docs/claims.md, "Hooks that use the stash")."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, hooks, index
from stellafleet.proc.flock import locked

LOCK_NAME = "hooks.lock"  # in the repository's .stella/private/: every worker and fleet of it
# lint-staged keeps its backup in the stash; a hook script may stash by itself
STASH_USE = re.compile(r"lint-staged|git\s+stash")
HOOK_NAMES = ("pre-commit", "commit-msg", "prepare-commit-msg")


def may_use_stash(root: Path) -> bool:
    """Whether root's commit hooks may use the stash (the pre-commit framework, run with --files by stella
    commit, does not)."""
    where = hooks.hooks_dir(root)
    for name in HOOK_NAMES:
        for script in (where / name, where.parent / name):  # husky's .husky/_/NAME runs .husky/NAME
            with contextlib.suppress(OSError):
                if script.is_file() and STASH_USE.search(script.read_text(errors="replace")):
                    return True
    return False


def serialised(setting: str | bool, root: Path) -> bool:
    """`[commit] serialize_hooks`: "auto" serialises when the hooks may use the stash."""
    return may_use_stash(root) if setting == "auto" else bool(setting)


Entry = tuple[str, str]  # a stash entry: its commit and its message
# lint-staged's backup: its lint-staged run drops it itself, so one there before the hooks ran is another's
LINT_STAGED = "lint-staged automatic backup"


@dataclasses.dataclass(frozen=True)
class Origin:
    """What the hooks ran on: the commits HEAD named (before and after them) and the trees of the index they
    saw (before and after them, and the new commit's when HEAD moved onto it)."""

    heads: frozenset[str]
    trees: frozenset[str]


def entries(root: Path) -> list[Entry]:
    """The stash list, newest first."""
    out = gitops.git("stash", "list", "--format=%H %gs", cwd=root)
    return [(sha, message) for sha, _, message in (line.partition(" ") for line in out.splitlines())]


def _index_tree(root: Path, index_file: Path | None) -> set[str]:
    """The tree of the index the hooks see (root's own when index_file is None); none if git cannot say."""
    env = index.with_index(index_file) if index_file else None
    tree = gitops.git("write-tree", cwd=root, env=env, check=False).strip()
    return {tree} if gitops.is_object_id(tree) else set()


def origin(root: Path, index_file: Path | None, before: Origin | None = None) -> Origin:
    """What the hooks run on, taken before them (before None) or after them (added to before)."""
    head = gitops.ref_commit(root, "HEAD")
    heads = set(before.heads) if before else set()
    trees = set(before.trees) if before else set()
    trees |= _index_tree(root, index_file)
    if head and before and head not in heads and gitops.ref_commit(root, f"{head}^") in heads:
        trees.add(index.tree_of(root, head))  # the commit the hooks passed: its tree was their index
    heads |= {head} if head else set()
    return Origin(frozenset(heads), frozenset(trees))


def made_by_hooks(root: Path, sha: str, ran: Origin) -> bool:
    """Whether a stash entry was made from what the hooks ran on: its first parent a commit HEAD named and
    its index (second parent) a tree of their index. A stash made in another tree or from another index is
    someone else's: yours."""
    out = gitops.git("rev-parse", f"{sha}^1", f"{sha}^2^{{tree}}", cwd=root, check=False)
    parents = out.split()
    return len(parents) == 2 and parents[0] in ran.heads and parents[1] in ran.trees


def _drop(root: Path, sha: str) -> bool:
    """Drop the entry sha by its place in the list; False if it is gone already. An entry that took that
    place meanwhile (a stash of yours pushed at that moment) is dropped instead: git names it, and it is
    stored again on top, with its message."""
    for _ in range(3):
        now = entries(root)
        places = [entry for entry, _ in now]
        if sha not in places:
            return False
        said = gitops.git("stash", "drop", f"stash@{{{places.index(sha)}}}", cwd=root)
        dropped = said.rstrip().rpartition("(")[2].rstrip(")")
        if dropped == sha:
            return True
        message = dict(now).get(dropped) or gitops.commit_subject(root, dropped) or "stash"
        gitops.git("stash", "store", "-m", message, dropped, cwd=root)
    raise GitError(f"git stash drop: the stash kept changing under it; drop {sha[:12]} yourself")


def put_back(root: Path, before: list[Entry], ran: Origin) -> None:
    """Remove what the hooks left in the stash and put back what was dropped while they ran, each said in
    one line; a lint-staged backup or an entry not made from what the hooks ran on is left alone."""
    after = entries(root)
    if after == before:
        return
    for sha, message in (entry for entry in after if entry not in before):
        if made_by_hooks(root, sha, ran):
            if _drop(root, sha):
                _say(f"a commit hook left stash entry {sha[:12]} ({message}); removed it")
        else:
            _say(f"stash entry {sha[:12]} ({message}) came while a commit hook ran, not from it; left it")
    dropped = [entry for entry in before if entry not in after and entry[1] != LINT_STAGED]
    for sha, message in reversed(dropped):  # oldest first: `store` puts each on top
        gitops.git("stash", "store", "-m", message, sha, cwd=root)
        _say(f"stash entry {sha[:12]} ({message}) was dropped while a commit hook ran; put it back on top")


def _say(line: str) -> None:
    print(f"stella: {line}", file=sys.stderr)


@contextlib.contextmanager
def guarded(lock: Path | None, root: Path, index_file: Path | None = None) -> Iterator[None]:
    """The hooks' run, under the repository's hook lock, the stash kept (lock None: neither). index_file:
    the index the hooks see (None: root's own). Tidying the stash never fails the commit: what git refused
    is said in one line."""
    if lock is None:
        yield
        return
    with locked(lock):
        before, ran = entries(root), origin(root, index_file)
        try:
            yield
        finally:
            try:
                if entries(root) != before:  # what the hooks ran on is only asked when the stash changed
                    put_back(root, before, origin(root, index_file, ran))
            except GitError as exc:
                _say(f"could not tidy the stash after the commit hooks ({exc}); see git stash list")
