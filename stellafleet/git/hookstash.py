"""Commit hooks that may use the stash run one commit at a time in a repository (`refs/stash` is one ref for
the main tree and every worktree), and the stash list is put back as it was around them."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from stellafleet.git import gitops, hooks
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


def entries(root: Path) -> list[Entry]:
    """The stash list, newest first."""
    out = gitops.git("stash", "list", "--format=%H %gs", cwd=root)
    return [(sha, message) for sha, _, message in (line.partition(" ") for line in out.splitlines())]


def put_back(root: Path, before: list[Entry]) -> None:
    """The stash list made what it was before the hooks ran, each change said in one line."""
    after = entries(root)
    if after == before:
        return
    added = [entry for entry in after if entry not in before]
    removed = [entry for entry in before if entry not in after]
    gitops.git("stash", "clear", cwd=root)
    for sha, message in reversed(before):  # oldest first: `store` puts each on top
        gitops.git("stash", "store", "-m", message, sha, cwd=root)
    for sha, message in added:
        print(f"stella: a commit hook left stash entry {sha[:12]} ({message}); removed it", file=sys.stderr)
    for sha, message in removed:
        print(
            f"stella: a commit hook dropped stash entry {sha[:12]} ({message}); put it back", file=sys.stderr
        )


@contextlib.contextmanager
def guarded(lock: Path | None, root: Path) -> Iterator[None]:
    """The hooks' run, under the repository's hook lock with the stash list kept (lock None: neither)."""
    if lock is None:
        yield
        return
    with locked(lock):
        before = entries(root)
        try:
            yield
        finally:
            put_back(root, before)
