"""The git guard: a shared-tree worker's `git` is stella's guard (git/guard.py), unless `[fleet] git_guard =
false`; it refuses what would change other workers' files or the index, or move HEAD."""

from __future__ import annotations

import threading

from stellafleet.git import guard
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings

GUARD_FOLDER = "gitguard"  # in .stella/private/: the one script every shared worker of the repository runs


class GitGuard(AttemptStep):
    def __init__(self, settings: RunSettings) -> None:
        self.enabled = settings.config.fleet.git_guard
        self.folder = settings.paths.private / GUARD_FOLDER
        self._installed = False
        self._lock = threading.Lock()  # attempts start on several threads

    def before_start(self, attempt: AttemptState) -> None:
        if not self.enabled or attempt.ctx.branch is not None:
            return
        with self._lock:
            if not self._installed:  # once per run: the script names this run's git and python
                guard.install(self.folder)
                self._installed = True
        attempt.env.update(guard.guarded_env(attempt.env, self.folder))
