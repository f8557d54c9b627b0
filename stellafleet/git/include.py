"""`.worktreeinclude`: the ignored files a new isolated worktree gets copied from the main tree.

`.worktreeinclude` at the repository root is gitignore syntax (the convention other agent tools share).
A file is copied when git itself says it is untracked, matches a pattern of `.worktreeinclude` and is
ignored by the repository's own ignore rules: tracked files come from the checkout, files outside the
repository are never listed, stella's own state never. Copies are copy-on-write clones where the file
system can (FICLONE, then copy_file_range), else plain copies; symlinks stay symlinks; a file over the
size limit is refused by name before anything is copied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.git import gitops

INCLUDE_FILE = ".worktreeinclude"
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


@dataclass(frozen=True)
class Copied:
    files: int
    bytes: int
    cloned: int  # how many of them were copy-on-write clones


def included_files(root: Path) -> list[str]:
    """The repository's ignored, untracked files that `.worktreeinclude` names, relative to root, sorted."""
    if not (root / INCLUDE_FILE).is_file():
        return []
    wanted = gitops.git_fields(
        "ls-files", "-z", "--others", "--ignored", f"--exclude-from={INCLUDE_FILE}", cwd=root
    )
    wanted = [path for path in wanted if not path.startswith((*EXCLUDED_DIRS, ".stella/"))]
    if not wanted:
        return []
    code, out, _err = gitops.git_status(
        "check-ignore", "-z", "--stdin", cwd=root, stdin="".join(f"{p}\0" for p in wanted)
    )
    if code not in (0, 1):
        raise StellaError(f"git check-ignore failed in {root}: {gitops.last_words(_err or out, code)}")
    ignored = {path for path in out.split("\0") if path}
    return sorted(path for path in wanted if path in ignored)


def check_sizes(root: Path, paths: Sequence[str], max_bytes: int) -> None:
    """StellaError naming every file over max_bytes (symlinks count as themselves, not their target)."""
    over = []
    for path in paths:
        st = (root / path).lstat()
        if st.st_size > max_bytes and not os.path.islink(root / path):
            over.append(f"{path} ({st.st_size / 1e6:.1f} MB)")
    if over:
        raise StellaError(
            f"{INCLUDE_FILE}: {', '.join(over)} over [worktree] include_max_mb = {max_bytes / 1e6:g}: "
            f"raise include_max_mb, or leave the file out of {INCLUDE_FILE}"
        )


def _clone(src: Path, dst: Path) -> bool:
    """dst as a copy of src, copy-on-write when the file system allows; True when it was a clone."""
    with src.open("rb") as fin, dst.open("wb") as fout:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return True
        size, offset = os.fstat(fin.fileno()).st_size, 0
        try:
            while offset < size:  # in-kernel copy: a reflink on file systems that can (btrfs, xfs, NFS 4.2)
                done = os.copy_file_range(fin.fileno(), fout.fileno(), size - offset, offset, offset)
                if done == 0:
                    break
                offset += done
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            fin.seek(offset)
            fout.seek(offset)
            shutil.copyfileobj(fin, fout, 1 << 20)
    return False


def copy_into(root: Path, worktree: Path, paths: Sequence[str]) -> Copied:
    """Copy paths (as included_files lists them) from root into worktree at the same place; an existing
    file there (the checkout's) is never overwritten."""
    files = size = cloned = 0
    for path in paths:
        src, dst = root / path, worktree / path
        if dst.exists() or dst.is_symlink():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            cloned += _clone(src, dst)
            shutil.copymode(src, dst)
            size += src.stat().st_size
        files += 1
    return Copied(files, size, cloned)
