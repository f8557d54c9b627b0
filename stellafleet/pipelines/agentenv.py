"""What a wrapped agent gets: its environment, its prompt with the commit rules, a scratch directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from stellafleet.core.workercontext import WorkerContext


def scratch_dir(ctx: WorkerContext) -> Path:
    """A private directory for this attempt's wrapper files (settings, logs), outside the work tree."""
    path = ctx.paths.private / "pipelines" / ctx.run_id / f"{ctx.task_id}-{ctx.attempt_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def agent_env(ctx: WorkerContext) -> dict[str, str]:
    """The CLI's environment: ours, the worker context and this installation's `stella` first on PATH."""
    env = dict(os.environ)
    env.update(ctx.to_env())
    bin_dir = str(Path(sys.executable).parent)
    if (Path(bin_dir) / "stella").exists():
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
        env["PATH"] = os.pathsep.join([bin_dir, *parts])
    return env


def commit_instructions(ctx: WorkerContext) -> str:
    if ctx.shared:
        return (
            "You are one of several agents working in the same git working tree at the same time.\n"
            "- Change only the files this task needs. If an edit is refused because another task holds the "
            "file, do not retry it: work around it or say so in your final answer.\n"
            "- Do not run `git add`, `git commit`, `git stash`, `git reset`, `git checkout` or "
            "`git restore`: they would sweep in or discard other agents' work.\n"
            '- To commit, run `stella commit -m "<message>" <path> [<path> ...]`, naming exactly the files '
            "you changed. It commits only those paths and records the commit for this task.\n"
            "- End with a short summary of what you did."
        )
    branch = f" on branch {ctx.branch}" if ctx.branch else ""
    return (
        f"You are working in your own git worktree{branch}; no one else writes here.\n"
        '- Commit your finished work before you stop (`git add <paths>` then `git commit -m "<message>"`, '
        'or `stella commit -m "<message>" <path> ...`). Every commit on this branch is recorded for '
        "this task; uncommitted changes are not part of the result.\n"
        "- End with a short summary of what you did."
    )


def agent_prompt(ctx: WorkerContext) -> str:
    return f"{ctx.prompt.rstrip()}\n\n---\n{commit_instructions(ctx)}\n"


def prompt_file(ctx: WorkerContext, prompt: str) -> Path:
    """prompt in a file of the attempt's scratch directory (one argument holds at most 128 KiB)."""
    path = scratch_dir(ctx) / "prompt.md"
    path.write_text(prompt, encoding="utf-8")
    return path
