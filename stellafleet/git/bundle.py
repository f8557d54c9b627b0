"""Git bundles: how an isolated task's work travels to another machine and back."""

from __future__ import annotations

from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops

# A bundle carries refs, not bare commits: the base is bundled under this ref, made and removed around it.
_BASE_REF = "refs/stella/bundle-base"
_START_REF = "refs/stella/bundle-start"


def create_base(root: Path, commit: str, out: Path, *, tag: str) -> None:
    """A bundle of commit and its history at out, its one ref naming commit (tag keeps runs apart)."""
    ref = f"{_BASE_REF}/{tag}"
    gitops.git("update-ref", ref, commit, cwd=root)
    try:
        gitops.git("bundle", "create", "-q", str(out), ref, cwd=root)
    finally:
        gitops.git("update-ref", "-d", ref, cwd=root, check=False)


def create_start(root: Path, commit: str, base: str, out: Path, *, tag: str) -> None:
    """A bundle of what commit holds past base (a --from-salvage start point), under one ref named by tag."""
    ref = f"{_START_REF}/{tag}"
    gitops.git("update-ref", ref, commit, cwd=root)
    try:
        gitops.git("bundle", "create", "-q", str(out), ref, f"^{base}", cwd=root)
    finally:
        gitops.git("update-ref", "-d", ref, cwd=root, check=False)


def fetch_start(repo: Path, bundle: Path, tag: str) -> str:
    """The objects of a create_start bundle into repo; the start commit (under a ref of tag: drop_start)."""
    heads = gitops.git("bundle", "list-heads", str(bundle), cwd=repo).split()
    if len(heads) < 2:
        raise GitError(f"git bundle {bundle}: it names no ref")
    gitops.git("fetch", "-q", str(bundle), f"+{heads[1]}:{_START_REF}/{tag}", cwd=repo)
    return heads[0]


def drop_start(repo: Path, tag: str) -> None:
    gitops.git("update-ref", "-d", f"{_START_REF}/{tag}", cwd=repo, check=False)


def check_out_start(repo: Path, bundle: Path, branch: str) -> None:
    """branch of a clone of the base, checked out at the commit of a create_start bundle instead."""
    commit = fetch_start(repo, bundle, "checkout")
    try:
        gitops.git("checkout", "-q", "-B", branch, commit, cwd=repo)
    finally:
        drop_start(repo, "checkout")


def clone_on_branch(bundle: Path, dest: Path, branch: str) -> str:
    """A new repository at dest holding the bundle's one ref as branch, checked out; returns its commit."""
    dest.mkdir(parents=True, exist_ok=True)
    gitops.git("init", "-q", cwd=dest)
    heads = gitops.git("bundle", "list-heads", str(bundle), cwd=dest).split()
    if len(heads) < 2:
        raise GitError(f"git bundle {bundle}: it names no ref")
    gitops.git("fetch", "-q", str(bundle), f"{heads[1]}:refs/heads/{branch}", cwd=dest)
    gitops.git("checkout", "-q", branch, cwd=dest)
    return heads[0]


def create_range(repo: Path, base: str, branch: str, out: Path) -> bool:
    """A bundle of base..branch at out; False (no file) when the branch has no commit past base."""
    if gitops.commits_ahead(repo, base, branch) == 0:
        return False
    gitops.git("bundle", "create", "-q", str(out), f"refs/heads/{branch}", f"^{base}", cwd=repo)
    return True


def create_ref(repo: Path, ref: str, after: str, out: Path) -> None:
    """A bundle of ref (any full ref name, e.g. a salvage ref) with only what after does not hold."""
    gitops.git("bundle", "create", "-q", str(out), ref, f"^{after}", cwd=repo)


def fetch_ref(root: Path, bundle: Path, ref: str) -> None:
    """Create ref in root from the bundle (it must not exist yet: no + in the refspec)."""
    gitops.git("fetch", "-q", str(bundle), f"{ref}:{ref}", cwd=root)


def fetch_branch(root: Path, bundle: Path | None, branch: str, base: str) -> None:
    """Create branch in root: the bundle's branch when there is one, else at base (nothing was committed)."""
    if bundle is None:
        gitops.git("branch", branch, base, cwd=root)
        return
    gitops.git("fetch", "-q", str(bundle), f"refs/heads/{branch}:refs/heads/{branch}", cwd=root)
