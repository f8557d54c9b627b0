"""`.worktreeinclude`: the ignored files a new isolated worktree gets from the main tree, or a Ray node."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
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
            size = f"{st.st_size / 1e6:.1f} MB"
            if round(st.st_size / 1e6, 1) <= round(max_bytes / 1e6, 1):  # not `1.0 MB over 1`: in bytes
                size = f"{st.st_size:,} bytes"
            over.append(f"{path} ({size})")
    if over:
        raise StellaError(
            f"{INCLUDE_FILE}: {', '.join(over)} over [worktree] include_max_mb = {max_bytes / 1e6:.7g}: "
            f"raise include_max_mb, or leave the file out of {INCLUDE_FILE}"
        )


class _Copier:
    """Copies with as few system calls as it can: a clone, then copy_file_range, else read/write. Every
    destination folder is opened one component at a time without following symlinks: a symlink the
    checkout holds among a destination's parents would take the copy outside the worktree."""

    def __init__(self, worktree: Path) -> None:
        self.worktree = worktree
        self.can_clone = True
        self.can_range = True
        self.folders: dict[str, int] = {}  # worktree-relative folder -> its open descriptor

    def parent(self, path: str) -> tuple[int, str]:
        """The open folder path is to be made in, and its name there; StellaError naming a symlink."""
        folder, name = os.path.split(path)
        return self._folder(folder, path), name

    def _folder(self, folder: str, path: str) -> int:
        if folder in self.folders:
            return self.folders[folder]
        if not folder:
            fd = os.open(self.worktree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            above, name = os.path.split(folder)
            at = self._folder(above, path)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=at)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise StellaError(
                    f"{INCLUDE_FILE}: {path} not copied: {folder} in the worktree is a symlink or a file, "
                    f"and a copy through it could land outside the repository: leave {path} out of "
                    f"{INCLUDE_FILE}, or keep {folder} a folder in the commit the task starts from"
                ) from None
        self.folders[folder] = fd
        return fd

    def close(self) -> None:
        for fd in self.folders.values():
            os.close(fd)
        self.folders.clear()

    def create(self, path: str, mode: int) -> int:
        """A new file at path in the worktree, open for writing; FileExistsError when it exists."""
        at, name = self.parent(path)
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=at
        )
        os.fchmod(fd, mode)
        return fd

    def symlink(self, target: str, path: str) -> None:
        at, name = self.parent(path)
        os.symlink(target, name, dir_fd=at)

    def copy(self, src: str, path: str, st: os.stat_result) -> bool:
        """path in the worktree as a copy of src (mode kept); True when it was a clone. FileExistsError
        when path exists."""
        with open(self.create(path, stat.S_IMODE(st.st_mode)), "wb") as fout, open(src, "rb") as fin:
            if self.can_clone:
                try:
                    fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
                    return True
                except OSError:
                    self.can_clone = False  # this file system cannot: do not ask again
            self._copy_range(fin.fileno(), fout.fileno(), st.st_size)
        return False

    def _copy_range(self, fin: int, fout: int, size: int) -> None:
        offset = 0
        if self.can_range:
            try:
                while offset < size:
                    done = os.copy_file_range(fin, fout, size - offset, offset, offset)
                    if done == 0:
                        break
                    offset += done
                return
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.can_range = False
        os.lseek(fin, offset, os.SEEK_SET)
        os.lseek(fout, offset, os.SEEK_SET)
        while chunk := os.read(fin, 1 << 20):
            os.write(fout, chunk)


def copy_into(root: Path, worktree: Path, paths: Sequence[str]) -> Copied:
    """Copy paths from root into worktree at the same place, never overwriting the checkout's files."""
    files = size = cloned = 0
    with contextlib.closing(_Copier(worktree)) as copier:
        for path in paths:
            src = os.path.join(root, path)
            st = os.lstat(src)
            with contextlib.suppress(FileExistsError):  # the checkout's own file: left as it is
                if stat.S_ISLNK(st.st_mode):
                    copier.symlink(os.readlink(src), path)
                else:
                    cloned += copier.copy(src, path, st)
                    size += st.st_size
                files += 1
    return Copied(files, size, cloned)


@dataclass(frozen=True)
class Packed:
    """One included file as it travels to another machine: its content, or a symlink's target."""

    path: str
    mode: int
    data: bytes
    link: bool = False


def pack(root: Path, paths: Sequence[str]) -> tuple[Packed, ...]:
    """The files at paths (as included_files lists them, check_sizes passed) read into memory."""
    packed = []
    for path in paths:
        src = os.path.join(root, path)
        st = os.lstat(src)
        if stat.S_ISLNK(st.st_mode):
            packed.append(Packed(path, 0, os.fsencode(os.readlink(src)), link=True))
        else:
            with open(src, "rb") as handle:
                packed.append(Packed(path, stat.S_IMODE(st.st_mode), handle.read()))
    return tuple(packed)


def unpack(files: Sequence[Packed], worktree: Path) -> Copied:
    """Write packed files into worktree at their paths, as copy_into does."""
    count = size = 0
    with contextlib.closing(_Copier(worktree)) as copier:
        for file in files:
            with contextlib.suppress(FileExistsError):
                if file.link:
                    copier.symlink(os.fsdecode(file.data), file.path)
                else:
                    with open(copier.create(file.path, file.mode), "wb") as out:
                        out.write(file.data)
                    size += len(file.data)
                count += 1
    return Copied(count, size, 0)
