"""Real git repositories and `stella` as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

GIT_NAME = "Test User"
GIT_EMAIL = "test@example.invalid"


def git(*args: str, cwd: Path) -> str:
    """Run git in cwd, returning stdout; fails the test with git's stderr on error."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


StellaRunner = Callable[..., subprocess.CompletedProcess[str]]


def run_stella(
    *args: str, cwd: Path | None, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """`stella ARGS...` as a real process (the installed package) with env over ours, stdin closed."""
    return subprocess.run(
        [sys.executable, "-m", "stellafleet", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


UPSTREAM_AUTHOR = ("-c", "user.name=Upstream", "-c", "user.email=upstream@example.invalid")


def add_submodule(repo: Path, tmp_path: Path) -> Path:
    """A real submodule at vendor/lib (a local repository added with `git submodule add`), committed."""
    upstream = tmp_path / "lib"
    upstream.mkdir()
    git("init", "-q", "-b", "main", cwd=upstream)
    (upstream / "lib.c").write_text("int lib;\n")
    git("add", "lib.c", cwd=upstream)
    git(*UPSTREAM_AUTHOR, "commit", "-q", "-m", "one", cwd=upstream)
    add = ("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(upstream), "vendor/lib")
    git(*add, cwd=repo)
    git("commit", "-q", "-m", "add the lib submodule", cwd=repo)
    return repo / "vendor" / "lib"
