"""The shared tree at the start of a run: a detached HEAD, the user's changes in claimed files, hooks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.words import plural
from stellafleet.git import gitops, hooks
from stellafleet.plan.model import Plan

STATE_DIR = ".stella/"  # stella's own files (the project config among them) are not the user's changes


@dataclass(frozen=True)
class TreeCheck:
    """What the start of a run found: lines to show, and the user's changed files (to keep out)."""

    notes: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


def _claimed_by(plan: Plan) -> dict[str, str]:
    return {claim: task.id for task in plan.tasks if task.isolation != "isolated" for claim in task.claims}


def _owner(path: str, claims: dict[str, str]) -> str | None:
    for claim, task_id in claims.items():
        if path == claim or path.startswith(claim.rstrip("/") + "/"):
            return task_id
    return None


def check_tree(
    root: Path, plan: Plan, config: Config, *, allow_dirty: bool, allow_detached: bool
) -> TreeCheck:
    """StellaError (exit 2) for a detached HEAD or claimed files with the user's changes; else the notes."""
    shared = any(task.isolation != "isolated" for task in plan.tasks)
    if not shared:
        return TreeCheck(_hook_notes(root, config))
    if gitops.current_branch(root) is None and not (allow_detached or config.fleet.allow_detached):
        head = gitops.head_commit(root)[:12]
        raise StellaError(
            f"HEAD is detached (at {head}): shared tasks would commit onto it, where only the reflog keeps "
            "their work once you check out a branch; check out a branch first, or pass --allow-detached "
            "to commit onto the detached HEAD anyway",
            exit_code=EXIT_USAGE,
        )
    changed = tuple(p for p in gitops.changed_paths(root) if not p.startswith(STATE_DIR))
    claims = _claimed_by(plan)
    dirty_claimed = [(path, owner) for path in changed if (owner := _owner(path, claims)) is not None]
    notes = list(_hook_notes(root, config))
    if dirty_claimed and not allow_dirty:
        named = ", ".join(f"{path} (task {owner})" for path, owner in dirty_claimed)
        raise StellaError(
            f"claimed files have uncommitted changes of yours: {named}; commit or stash them first, or "
            "pass --allow-dirty (the workers' commits of them then leave your changes out)",
            exit_code=EXIT_USAGE,
        )
    if dirty_claimed:
        named = ", ".join(path for path, _ in dirty_claimed)
        notes.append(
            f"warning: --allow-dirty: {named} {'has' if len(dirty_claimed) == 1 else 'have'} uncommitted "
            "changes of yours; the workers' commits take only what the workers write, and your changes "
            "stay uncommitted"
        )
    elif changed:
        notes.append(
            f"your work tree has uncommitted changes ({plural(len(changed), 'file')}): they stay yours, "
            "workers' commits leave them out"
        )
    return TreeCheck(tuple(notes), changed)


def _hook_notes(root: Path, config: Config) -> tuple[str, ...]:
    if config.commit.hooks != "skip":
        return ()
    names = hooks.installed(root)
    if not names:
        return ()
    return (
        f'warning: [commit] hooks = "skip": the installed {" and ".join(names)} hooks will not run for the '
        "workers' commits",
    )
