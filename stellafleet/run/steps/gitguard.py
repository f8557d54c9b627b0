"""The git guard: a shared-tree worker's `git` is stella's guard (git/guard.py), unless `[fleet] git_guard =
false`; it refuses what would change other workers' files or the index, or move HEAD. An isolated worker's
is one when its commit hooks are serialised: its own `git commit` runs them under the hook lock."""

from __future__ import annotations

import threading

from stellafleet.git import guard
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings

GUARD_FOLDER = "gitguard"  # in .stella/private/: the one script every shared worker of the repository runs
ISOLATED_FOLDER = "gitguard-isolated"


class GitGuard(AttemptStep):
    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self._installed: set[str] = set()
        self._lock = threading.Lock()  # attempts start on several threads

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
