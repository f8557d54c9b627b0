"""The user's uncommitted changes at the start of a run, kept out of the workers' commits (a 3-way merge)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, index

BINARY_PROBE_BYTES = 8000
Snapshot = Mapping[str, str | None]  # path -> the blob of the user's version (None: the file was absent)


def snapshot_file(root: Path, run_id: str) -> Path:
    return StatePaths(root).private / "dirty" / f"{run_id}.json"


def take(root: Path, paths: Sequence[str]) -> dict[str, str | None]:
    """The user's version of each path as it is now (written to the object store)."""
    present = [path for path in paths if (root / path).is_file() and not (root / path).is_symlink()]
    blobs = gitops.git(
        "hash-object", "-w", "--stdin-paths", cwd=root, stdin="".join(f"{p}\n" for p in present)
    )
    found: dict[str, str | None] = dict.fromkeys(paths)
    found.update(zip(present, blobs.split(), strict=True))
    return found


def save(root: Path, run_id: str, snapshot: Snapshot) -> None:
    file = snapshot_file(root, run_id)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(snapshot)))
    os.replace(tmp, file)


def load(root: Path, run_id: str) -> dict[str, str | None]:
    try:
        data = json.loads(snapshot_file(root, run_id).read_text())
    except (OSError, ValueError):
        return {}
    return {str(path): (str(blob) if blob else None) for path, blob in dict(data).items()}


def worker_entries(root: Path, paths: Sequence[str], snapshot: Snapshot) -> dict[str, tuple[str, str]]:
    """The entry to commit (HEAD's version plus the worker's changes) for paths the user had changed."""
    entries: dict[str, tuple[str, str]] = {}
    head = gitops.ref_commit(root, "HEAD")
    for path in paths:
        full = root / path
        if path not in snapshot or not full.is_file() or full.is_symlink():
            continue
        user = snapshot[path]
        ours = gitops.git("hash-object", "--", path, cwd=root).strip()
        committed = index.tree_entries(root, head, [path]).get(path) if head else None
        if ours == user:  # the worker did not change it: HEAD's version stays
            if committed is None:
                raise StellaError(f"nothing to commit: {path} holds only your own uncommitted changes")
            entries[path] = committed
            continue
        mode = "100755" if full.stat().st_mode & stat.S_IXUSR else "100644"
        head_blob = committed[1] if committed else None
        if user == head_blob:  # your changes were committed since (or undone): the file is the worker's
            entries[path] = (mode, gitops.git("hash-object", "-w", "--", path, cwd=root).strip())
            continue
        entries[path] = (mode, _merge(root, path, head_blob, user))
    return entries


def salvage_entries(
    root: Path, paths: Sequence[str], snapshot: Snapshot
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """For a salvage of paths: (the entries, the paths to drop) of those the user had changed, each HEAD's
    version plus the worker's change as `stella commit` splits it; HEAD's version (or none) where the
    worker left only the user's changes or the two cannot be split. The user's edits are never taken."""
    entries: dict[str, tuple[str, str]] = {}
    removed: list[str] = []
    head = gitops.ref_commit(root, "HEAD")
    for path in (path for path in paths if path in snapshot):
        try:
            entries.update(worker_entries(root, [path], snapshot))
        except StellaError:
            committed = index.tree_entries(root, head, [path]).get(path) if head else None
            if committed is None:
                removed.append(path)
            else:
                entries[path] = committed
    return entries, removed


def _unpack(root: Path, blob: str | None, scratch: Path, name: str) -> Path:
    """A blob's bytes in a file of scratch (empty for None), by git itself, with no text decoding."""
    target = scratch / name
    if blob is None:
        target.write_bytes(b"")
        return target
    env = {"GIT_DIR": str(gitops.common_dir(root))}  # unpack-file writes into its cwd: scratch
    made = gitops.git("unpack-file", blob, cwd=scratch, env=env).strip()
    os.replace(scratch / made, target)
    return target


def _merge(root: Path, path: str, head_blob: str | None, user_blob: str | None) -> str:
    """The blob of HEAD's version plus what the work tree changed since the user's version (as bytes)."""
    with tempfile.TemporaryDirectory(prefix="stella-dirty-") as tmp:
        head_file = _unpack(root, head_blob, Path(tmp), "head")
        user_file = _unpack(root, user_blob, Path(tmp), "user")
        versions = (head_file.read_bytes(), user_file.read_bytes(), (root / path).read_bytes())
        if any(b"\0" in data[:BINARY_PROBE_BYTES] for data in versions):  # git's test (buffer_is_binary)
            yours = f"blob {user_blob[:12]}" if user_blob else "the file deleted"
            raise StellaError(
                f"cannot commit {path} with only the worker's changes: it is a binary file, which git "
                f"cannot merge, and it had uncommitted changes of yours when the run started (your "
                f"version: {yours}); commit your version of it first, then commit the file again, or "
                f"commit it yourself with both (`git add {path} && git commit`)",
                exit_code=1,
            )
        args = ["merge-file", "-L", "HEAD", "-L", "yours", "-L", "worker"]
        retcode, _, err = gitops.git_status(*args, str(head_file), str(user_file), path, cwd=root)
        if retcode != 0:
            raise StellaError(
                f"cannot commit {path} without your own uncommitted changes in it: the worker's changes "
                "overlap them (it had changes of yours when the run started); commit or stash yours and "
                f"commit the file again{': ' + gitops.last_words(err, retcode) if retcode < 0 else ''}",
                exit_code=1,
            )
        return gitops.git("hash-object", "-w", "--no-filters", str(head_file), cwd=root).strip()
