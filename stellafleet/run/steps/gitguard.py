"""The git guard: a shared-tree worker's `git` is stella's guard (git/guard.py), unless `[fleet] git_guard =
false`; it refuses what would change other workers' files or the index, or move HEAD. An isolated worker's
is one when its commit hooks are serialised: its own `git commit` runs them under the hook lock. Before the
run: which hooks the workers' commits run."""

from __future__ import annotations

import threading

from stellafleet.git import guard, hooks
from stellafleet.run.steps import AttemptState, AttemptStep, BeforeRun, Preflight, RunSettings

GUARD_FOLDER = "gitguard"  # in .stella/private/: the one script every shared worker of the repository runs
ISOLATED_FOLDER = "gitguard-isolated"


def users_commits_warning(framework: bool) -> str:
    """What shared tasks mean for the user's own `git commit` during the run, whose pre-commit hook runs in
    the shared tree (the workers' commits run theirs in the commit tree)."""
    if framework:
        return (
            "the pre-commit framework is installed: your own `git commit` during the run stashes the "
            "workers' unfinished files while its hooks run (their commits may be refused); commit with "
            "`stella commit -m MSG PATH...` instead"
        )
    return (
        "your own `git commit` during the run runs the pre-commit hook in the shared tree, where it sees the "
        "workers' unfinished files; `stella commit -m MSG PATH...` runs it on exactly your commit"
    )


class GitGuard(AttemptStep):
    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self._installed: set[str] = set()
        self._lock = threading.Lock()  # attempts start on several threads

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """Which hooks the workers' commits run; a warning when the user's own commits would disturb them."""
        root, tasks = before.root, before.plan.tasks
        found = hooks.installed(root)
        if not found:
            return Preflight()
        listed = " and ".join(found.names)
        if before.config.commit.hooks == "skip":
            skipped = (
                f'[commit] hooks = "skip": the installed {listed} hooks will not run for the '
                "workers' commits"
            )
            return Preflight(warnings=(skipped,))
        notes: list[str] = []
        warnings: list[str] = []
        if any(task.isolation == "isolated" for task in tasks):
            where = found.where
            shown = where.relative_to(root) if where.is_relative_to(root) else where
            notes.append(f"isolated tasks' commits run the {listed} hooks of {shown}")
        if "pre-commit" in found and any(task.isolation != "isolated" for task in tasks):
            warnings.append(users_commits_warning(hooks.framework_installed(found.where)))
        return Preflight(warnings=tuple(warnings), notes=tuple(notes))

    def before_start(self, attempt: AttemptState) -> None:
        settings = self.settings
        if attempt.ctx.shared and settings.config.fleet.git_guard:
            name, diverted = GUARD_FOLDER, guard.SHARED
        elif not attempt.ctx.shared and not attempt.remote and settings.serialize_hooks:
            name, diverted = ISOLATED_FOLDER, guard.ISOLATED
        else:
            return
        folder = settings.paths.private / name
        with self._lock:
            if name not in self._installed:  # once per run: the script names this run's git and python
                guard.install(folder, diverted)
                self._installed.add(name)
        attempt.env.update(guard.guarded_env(attempt.env, folder))
