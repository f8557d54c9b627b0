"""Where stella keeps its state inside a repository (DESIGN section 5)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = (".stella/private/", ".stella/worktrees/")


class NotRegularFile(OSError):
    """A path a worker wrote (a result, a fragment) that is a FIFO, a device or a socket."""


def read_regular(path: Path, limit: int = -1) -> bytes:
    """path's bytes (at most limit), opened so a FIFO or a device planted there never blocks: NotRegularFile
    for anything but a regular file, FileNotFoundError and the other OSErrors as open raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path} is not a regular file (a FIFO, a device or a socket)")
        with os.fdopen(os.dup(fd), "rb") as stream:
            return stream.read(limit)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def stella_dir(self) -> Path:
        return self.root / ".stella"

    @property
    def config_file(self) -> Path:
        return self.stella_dir / "config.toml"

    @property
    def private(self) -> Path:
        return self.stella_dir / "private"

    @property
    def fleet_db(self) -> Path:
        return self.private / "fleet.db"

    @property
    def config_checked(self) -> Path:
        return self.private / "config-checked"  # the config last found valid (core/config.py)

    @property
    def store_db(self) -> Path:
        return self.private / "store.db"

    @property
    def journal(self) -> Path:
        """The journal's records and owner locks (state/journal.py)."""
        return self.private

    @property
    def merge_journal(self) -> Path:
        """The running `stella merge`'s journal record (merge/journal.py)."""
        return self.journal / "merge.json"

    @property
    def worktrees(self) -> Path:
        return self.stella_dir / "worktrees"

    def log_file(self, run_id: str, task_id: str) -> Path:
        return self.private / "logs" / run_id / f"{task_id}.log"

    def check_log(self, run_id: str, task_id: str, attempt_id: int, phase: str) -> Path:
        """What one run of a task's check printed (its last MB)."""
        return self.private / "logs" / run_id / f"{task_id}-{attempt_id}.check-{phase}.log"

    def transcript_file(self, run_id: str, task_id: str) -> Path:
        return self.private / "transcripts" / run_id / f"{task_id}.jsonl"

    def result_file(self, run_id: str, task_id: str, attempt_id: int) -> Path:
        return self.private / "results" / run_id / f"{task_id}-{attempt_id}.json"

    def prompt_file(self, run_id: str, task_id: str, attempt_id: int) -> Path:
        return self.private / "prompts" / run_id / f"{task_id}-{attempt_id}.txt"

    def fragment_file(self, run_id: str, task_id: str, attempt_id: int) -> Path:
        """Where an expanding task's worker writes its plan fragment ($STELLA_PLAN_OUT)."""
        return self.private / "fragments" / run_id / f"{task_id}-{attempt_id}.plan"


HOST_STATE_VAR = "STELLA_HOST_STATE"  # where the host-wide state lives (tests point it into tmp_path)


def host_state_dir(env: dict[str, str] | None = None) -> Path:
    """What every repository's stella shares on this machine (the leases of ports and locks):
    $STELLA_HOST_STATE, else the user's state directory ($XDG_STATE_HOME or ~/.local/state) /stella."""
    env = dict(os.environ) if env is None else env
    if env.get(HOST_STATE_VAR):
        return Path(env[HOST_STATE_VAR])
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "stella"
