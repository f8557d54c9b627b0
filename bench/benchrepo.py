"""What the bench scripts share: a command's output, and a scratch repository to fill and commit."""

from __future__ import annotations

import subprocess
from pathlib import Path


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def new_repo(root: Path) -> Path:
    """An empty repository at root on branch main, with a committer identity of its own."""
    root.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "config", "user.name", "bench", cwd=root)
    sh("git", "config", "user.email", "bench@example.invalid", cwd=root)
    return root


def commit_all(root: Path, message: str) -> Path:
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-q", "-m", message, cwd=root)
    return root
