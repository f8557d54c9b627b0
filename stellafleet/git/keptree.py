"""A kept tree: one detached worktree at a fixed path, made and readied once, then moved from commit to
commit with one checkout (the shared commit tree, the merge's check trees); a fresh worktree costs seconds
on a large repository, a move costs what changed.

The contract:
- `held()` is the tree's flock (beside it, `<path>.lock`): every use of the tree, its move and what runs in
  it after, is inside it, so concurrent users (threads or processes) take turns; a killed holder's lock
  goes with it.
- `move_to(commit)` (holding it) makes the tree when it is missing or broken (`git worktree add --detach`,
  then the `ready` callable given: the one readying function, run/bootstrap.ready), else checks commit out
  with `git checkout --force --detach` and removes every untracked file that is not ignored (`git clean
  -ffd`): no tracked change and no untracked, non-ignored file of one use reaches the next, while ignored
  ones (node_modules, build outputs) stay. `ready` runs again only when a path of `setup_inputs` (git
  pathspecs: a lockfile) differs between the commit it last ran for and commit, or it never finished.
- It is never used half-moved: a marker (`<path>.moving`, the commit being moved to) is written before the
  move and removed once the tree holds the commit, clean. A move killed halfway leaves the marker; the next
  user (under the lock) sees it and redoes the move in full (`Moved.redone`: the caller says so). The
  commit `ready` last finished for is `<path>.ready`: a killed or failed readying leaves none, so it runs
  again next time.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, worktrees
from stellafleet.proc.flock import locked

Ready = Callable[[Path], object]  # readies a tree that holds its commit (raises when it cannot)


@dataclass(frozen=True)
class Moved:
    """What one move did: made the tree, ran `ready`, redid a move a killed user left halfway."""

    made: bool = False
    readied: bool = False
    redone: bool = False


class KeptTree:
    """The kept tree of root at path (see the module's contract)."""

    def __init__(self, root: Path, path: Path, *, ready: Ready, setup_inputs: Sequence[str] = ()) -> None:
        self.root = root
        self.path = path
        self.ready = ready
        self.setup_inputs = tuple(setup_inputs)
        self._lock = path.with_name(f"{path.name}.lock")
        self._moving = path.with_name(f"{path.name}.moving")
        self._ready_at = path.with_name(f"{path.name}.ready")

    @contextlib.contextmanager
    def held(self) -> Iterator[KeptTree]:
        """The tree's lock for the body, waited for while another user holds it."""
        with locked(self._lock):
            yield self

    def move_to(self, commit: str) -> Moved:
        """The tree holding exactly commit, clean but for ignored files, readied when need be (call while
        holding it); `ready`'s own exception when it cannot be readied (the tree then holds commit)."""
        redone = self._moving.exists()
        self._moving.write_text(commit)
        made = not self._usable()
        if made:
            self._make(commit)
        else:
            self._checkout(commit)
        readied = self._needs_ready(commit)
        if readied:
            self._ready_at.unlink(missing_ok=True)
            self._moving.unlink()  # the tree holds commit: only the readying is left, redone if it fails
            self.ready(self.path)
            self._ready_at.write_text(commit)
        else:
            self._moving.unlink()
        return Moved(made, readied, redone)

    @property
    def git_dir(self) -> Path | None:
        """The tree's own git directory (its index, HEAD), as its `.git` file names it; None: none there."""
        try:
            text = (self.path / ".git").read_text()
        except OSError:
            return None
        named = self.path / text.removeprefix("gitdir:").strip()  # relative to the tree, or absolute
        return named if text.startswith("gitdir:") and (named / "HEAD").is_file() else None

    def _usable(self) -> bool:
        """Whether path is a worktree of root that git can work in (read from files: no git started)."""
        return self.git_dir is not None

    def _make(self, commit: str) -> None:
        """A new detached worktree at path (whatever was left there first removed)."""
        if self.path.exists() or self.path.is_symlink():
            with contextlib.suppress(GitError):
                worktrees.worktree_remove(self.root, self.path, force=True)
            shutil.rmtree(self.path, ignore_errors=True)
        gitops.git("worktree", "prune", cwd=self.root, check=False)
        self._ready_at.unlink(missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        worktrees.worktree_add(self.root, self.path, None, commit)

    def _checkout(self, commit: str) -> None:
        """commit checked out over whatever the last user left, then every untracked, non-ignored file
        removed; an index.lock left by a killed user (none is alive: we hold the lock) goes first."""
        if (git_dir := self.git_dir) is not None:
            (git_dir / "index.lock").unlink(missing_ok=True)
        gitops.git("checkout", "--force", "--quiet", "--detach", commit, cwd=self.path)
        gitops.git("clean", "-ffdq", cwd=self.path)

    def _needs_ready(self, commit: str) -> bool:
        """Whether `ready` is to run for commit: never finished, or a setup input changed since it did."""
        try:
            last = self._ready_at.read_text().strip()
        except OSError:
            return True
        if last == commit or not self.setup_inputs:
            return False
        if gitops.ref_commit(self.root, last) is None:
            return True  # a commit gone (gc'd after a reset): nothing to compare with
        changed = gitops.git("diff", "--name-only", last, commit, "--", *self.setup_inputs, cwd=self.root)
        return bool(changed.strip())
