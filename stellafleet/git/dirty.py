"""The user's uncommitted changes at the start of a run, kept out of the workers' commits.

At its start a run notes the version of every file the user has changed and not committed (its blob,
written to the object store, or its absence) in `.stella/private/dirty/<run>.json`. A worker's
`stella commit` of such a file then commits HEAD's version plus exactly what the worker changed since the
run started (a three-way merge of HEAD's version, the user's and the worker's: `git merge-file`), so the
user's own edits stay uncommitted in the file, as they were; where the worker's changes overlap the user's
the commit is refused, naming the file. A run refuses to start when a file a shared task claims has such
changes, unless asked to with --allow-dirty.
"""

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


def _blob_text(root: Path, blob: str | None) -> str:
    return gitops.git("cat-file", "blob", blob, cwd=root) if blob else ""


def worker_entries(root: Path, paths: Sequence[str], snapshot: Snapshot) -> dict[str, tuple[str, str]]:
    """For those of paths the user had changed at the start (and the worker changed since, and did not
    delete): the entry to commit, HEAD's version plus the worker's changes only."""
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
        entries[path] = (mode, _merge(root, path, committed[1] if committed else None, user))
    return entries


def _merge(root: Path, path: str, head_blob: str | None, user_blob: str | None) -> str:
    """The blob of HEAD's version of path plus what the work tree changed since the user's version."""
    with tempfile.TemporaryDirectory(prefix="stella-dirty-") as tmp:
        head_file, user_file = Path(tmp) / "head", Path(tmp) / "user"
        head_file.write_text(_blob_text(root, head_blob))
        user_file.write_text(_blob_text(root, user_blob))
        args = ["merge-file", "-p", "-L", "HEAD", "-L", "yours", "-L", "worker"]
        retcode, out, err = gitops.git_status(*args, str(head_file), str(user_file), path, cwd=root)
    if retcode != 0:
        raise StellaError(
            f"cannot commit {path} without your own uncommitted changes in it: the worker's changes "
            "overlap them (it had changes of yours when the run started); commit or stash yours and "
            f"commit the file again{': ' + gitops.last_words(err, retcode) if retcode < 0 else ''}",
            exit_code=1,
        )
    return gitops.git("hash-object", "-w", "--stdin", cwd=root, stdin=out).strip()
