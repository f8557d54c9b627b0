"""Real git repositories, and `stella` as a real process or through cli.main in this one."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
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


def stella_here(
    *args: str, cwd: Path | None, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """`stella ARGS...` through cli.main in this process, answering as run_stella does (exit code, stdout,
    stderr), for the tests where the process boundary is not the point: a new Python's imports cost each
    call about 0.3 s of CPU. cwd, os.environ and the root logger (which cli.main configures) are put back
    afterwards. The timeout is not enforced; it is here so both runners take the same arguments."""
    from stellafleet.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []  # so cli.main's logging.basicConfig writes to this call's stderr
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's --help and --version
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        root.handlers, root.level = saved_handlers, saved_level
    return subprocess.CompletedProcess(["stella", *args], code, out.getvalue(), err.getvalue())
