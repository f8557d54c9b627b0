"""Every git call goes through gitops' one runner: no other module of the package names the git program.

The fakes in stellafleet/testing/ are the exception, as they are for the process runner: the local GitHub
server stands for GitHub's side of a push (`git http-backend`, its merges), which is not stellafleet's git."""

from __future__ import annotations

import ast
from pathlib import Path

import stellafleet

PACKAGE = Path(stellafleet.__file__).parent
RUNNER = PACKAGE / "git" / "gitops.py"


def modules_naming_git() -> dict[str, list[int]]:
    """Package module -> the lines where the string "git" (an executable to run) appears."""
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "testing":
            continue
        lines = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value == "git"
        ]
        if lines:
            found[path.relative_to(PACKAGE).as_posix()] = lines
    return found


def test_only_the_gitops_runner_names_the_git_program() -> None:
    assert list(modules_naming_git()) == [RUNNER.relative_to(PACKAGE).as_posix()]
