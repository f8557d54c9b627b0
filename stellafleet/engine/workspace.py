"""The workspace a worker may touch: every path confined to it, every shared-tree write claimed first."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.engine.errors import ToolFailure

ClaimFn = Callable[[str], None]  # raises ClaimConflict when another live worker holds the path


@dataclass
class Workspace:
    root: Path
    claim: ClaimFn | None = None
    written: dict[str, None] = field(default_factory=dict)  # every path written, in order
    uncommitted: dict[str, None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    def relative(self, given: str) -> str:
        """The normalised workspace-relative spelling of a path the model gave, or ToolFailure."""
        if not isinstance(given, str) or not given.strip():
            raise ToolFailure("path is empty: give a path relative to the workspace")
        text = given.strip().replace("\\", "/")
        if text.startswith(("/", "~")) or PureWindowsPath(given).drive:
            raise ToolFailure(f"{given}: absolute paths are refused; give a path relative to the workspace")
        normal = posixpath.normpath(text)
        if normal == ".." or normal.startswith("../"):
            raise ToolFailure(f"{given}: the path climbs out of the workspace; stay inside it")
        return normal

    def resolve(self, given: str) -> tuple[Path, str]:
        """(absolute path, workspace-relative path) after following symlinks; refused if it leaves."""
        rel = self.relative(given)
        full = (self.root / rel).resolve()
        if full != self.root and not full.is_relative_to(self.root):
            raise ToolFailure(f"{given}: the path leads outside the workspace through a symlink; refused")
        real_rel = full.relative_to(self.root).as_posix() if full != self.root else "."
        return full, real_rel

    def resolve_for_write(self, given: str) -> tuple[Path, str]:
        full, rel = self.resolve(given)
        first = rel.split("/", 1)[0]
        if rel == "." or first == ".git" or any((rel + "/").startswith(d) for d in EXCLUDED_DIRS):
            raise ToolFailure(f"{given}: writing there is refused (repository or stella state, not work)")
        if full.is_dir():
            raise ToolFailure(f"{given}: is a directory; name a file")
        return full, rel

    def take_claim(self, rel: str) -> None:
        """The implicit claim before a write (shared tree only); ClaimConflict goes back to the model."""
        if self.claim is not None:
            self.claim(rel)

    def record_write(self, rel: str) -> None:
        self.written[rel] = None
        self.uncommitted[rel] = None
