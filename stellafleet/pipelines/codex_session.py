"""What the codex wrapper needs beyond `codex exec --json`: writable git roots and its session log."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stellafleet.core.errors import GitError
from stellafleet.git import gitops
from stellafleet.pipelines.support import complete_lines, json_line


def git_dirs(workspace: Path) -> list[str]:
    """The absolute git directories a commit in workspace writes to (common dir first); [] outside git."""
    found: list[str] = []
    try:
        for flag in ("--git-common-dir", "--git-dir"):
            out = gitops.git("rev-parse", "--path-format=absolute", flag, cwd=workspace).strip()
            if out and out not in found:
                found.append(out)
    except GitError:
        return []
    return found


def writable_roots_arg(workspace: Path) -> list[str]:
    """`-c sandbox_workspace_write.writable_roots=[...]` for the workspace's git dirs ([] outside git)."""
    dirs = git_dirs(workspace)
    if not dirs:
        return []
    # A JSON string is a TOML basic string, which is how `-c` parses the value.
    return ["-c", f"sandbox_workspace_write.writable_roots=[{', '.join(json.dumps(d) for d in dirs)}]"]


def codex_home(env: Mapping[str, str]) -> Path:
    """Where Codex keeps its sessions: $CODEX_HOME, else ~/.codex."""
    home = env.get("CODEX_HOME")
    return Path(home) if home else Path(env.get("HOME") or os.path.expanduser("~")) / ".codex"


# Called with each running total from the session log; returns why to stop Codex, or None.
TotalHandler = Callable[[dict[str, Any]], str | None]


class SessionLog:
    """Follows one thread's session log on each poll and hands every `token_count` total on."""

    def __init__(self, home: Path, on_total: TotalHandler, thread_id: Callable[[], str | None]) -> None:
        self.home = home
        self.on_total = on_total
        self.thread_id = thread_id  # the thread's id once Codex has said it
        self.path: Path | None = None
        self.offset = 0

    def find(self) -> Path | None:
        thread = self.thread_id()
        if self.path is None and thread:
            matches = sorted((self.home / "sessions").glob(f"*/*/*/rollout-*{thread}.jsonl"))
            self.path = matches[-1] if matches else None
        return self.path

    def __call__(self) -> str | None:
        path = self.find()
        if path is None:
            return None
        try:
            lines, self.offset = complete_lines(path, self.offset)
        except OSError:
            return None
        reason = None
        for raw in lines:  # none while Codex is half-way through a line
            total = token_total(raw)
            if total is not None:
                reason = self.on_total(total) or reason
        return reason


def token_total(raw: str) -> dict[str, Any] | None:
    """The thread's running usage from one session-log line, when it is a `token_count` event."""
    record = json_line(raw)
    payload = record.get("payload") if record is not None else None
    if not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get("total_token_usage") if isinstance(info, dict) else None
    return total if isinstance(total, dict) else None
