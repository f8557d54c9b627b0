"""Submodules: a worker commits a submodule's pointer, never a file inside it; worktrees get them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from stellafleet.core.errors import GitError, StellaError
from stellafleet.git import gitops

log = logging.getLogger(__name__)


def declared(root: Path) -> dict[str, str]:
    """name -> path of every submodule .gitmodules declares in root's work tree (empty: none)."""
    if not (root / ".gitmodules").is_file():
        return {}
    out = gitops.git(
        "config", "-f", ".gitmodules", "-z", "--get-regexp", r"^submodule\..*\.path$", cwd=root, check=False
    )
    found: dict[str, str] = {}
    for record in out.split("\0"):
        if "\n" in record:
            key, path = record.split("\n", 1)
            found[key[len("submodule.") : -len(".path")]] = path.strip("/")
    return found


def gitlinks(root: Path) -> list[str]:
    """The paths HEAD and the index record as submodules (gitlinks), whether or not .gitmodules names them."""
    paths = set(declared(root).values())
    if not paths and not (root / ".gitmodules").exists():
        return []
    out = gitops.git_fields("ls-files", "-s", "-z", cwd=root)
    paths |= {record.split("\t", 1)[1] for record in out if record.startswith("160000 ")}
    return sorted(paths)


def refuse_inside(root: Path, paths: Sequence[str]) -> None:
    """StellaError (exit 2) naming the submodule when a path lies inside one."""
    subs = gitlinks(root)
    for path in paths:
        for sub in subs:
            if path.startswith(sub + "/"):
                raise StellaError(
                    f"cannot commit {path}: it is inside the submodule {sub}, which is a repository of its "
                    f"own; commit it there (cd {sub} && git commit), then `stella commit {sub}` records "
                    "the submodule's new commit here"
                )


def init_in_worktree(root: Path, worktree: Path) -> list[str]:
    """Initialise (from local clones) the submodules the main tree has checked out; the paths initialised."""
    wanted = {name: path for name, path in declared(worktree).items() if (root / path / ".git").exists()}
    if not wanted:
        return []
    urls = [arg for name, path in wanted.items() for arg in ("-c", f"submodule.{name}.url={root / path}")]
    try:
        gitops.git(
            "-c", "protocol.file.allow=always", *urls,
            "submodule", "update", "--init", "--recursive", "-q", "--", *wanted.values(),
            cwd=worktree,
        )  # fmt: skip
    except GitError as exc:
        log.warning("could not initialise the submodules of %s: %s", worktree, exc)
        return []
    return list(wanted.values())
