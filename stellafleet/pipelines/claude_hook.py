"""The hooks of a Claude Code worker in the shared tree: PreToolUse claims each file it edits (failing
closed) and opens a write span for every tool that can write the tree; PostToolUse (and
PostToolUseFailure) closes it. A span never closed (the tool was stopped) lasts to the attempt's end."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.errors import ClaimConflict
from stellafleet.state.claims import ClaimStore, Holder

HOOK_TOOLS = "Edit|Write|MultiEdit|NotebookEdit|Bash"  # the tools that can write the tree
SPAN_ENDS = ("PostToolUse", "PostToolUseFailure")  # Claude Code's events after a tool call, ok or failed
HOOK_TIMEOUT_S = 30


@dataclass(frozen=True)
class HookContext:
    """Who is editing: written by the wrapper next to the settings file it hands to Claude Code."""

    workspace: str
    store_db: str
    holder: Holder  # the worker process: the claim lives as long as the attempt, not as long as this hook

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> HookContext:
        data = json.loads(path.read_text())
        holder = Holder(**{key: data["holder"][key] for key in Holder.__dataclass_fields__})
        return cls(data["workspace"], data["store_db"], holder)


def hook_settings(context_file: Path) -> dict[str, Any]:
    """The `--settings` content that adds the hooks before and after every tool that can write."""
    # Claude Code runs hook commands through a shell
    command = shlex.join([sys.executable, "-m", "stellafleet.pipelines.claude_hook", str(context_file)])
    group = {
        "matcher": HOOK_TOOLS,
        "hooks": [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}],
    }
    return {"hooks": {event: [group] for event in ("PreToolUse", *SPAN_ENDS)}}


def edited_path(event: dict[str, Any]) -> str | None:
    tool_input = event.get("tool_input")
    if not isinstance(tool_input, dict):
        return None
    for key in ("file_path", "notebook_path"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def workspace_relative(path: str, workspace: str, cwd: str | None) -> str | None:
    """path relative to the workspace (symlinks resolved), or None when it lies outside."""
    base = Path(cwd) if cwd else Path(workspace)
    absolute = Path(path) if os.path.isabs(path) else base / path
    root = os.path.realpath(workspace)
    real = os.path.realpath(absolute)
    try:
        relative = os.path.relpath(real, root)
    except ValueError:
        return None
    if relative == "." or relative == ".." or relative.startswith(".." + os.sep):
        return None
    return relative.replace(os.sep, "/")


def decide(event: dict[str, Any], context: HookContext) -> str | None:
    """None to let the edit go ahead (claim taken or already ours), else the reason to deny it."""
    path = edited_path(event)
    if path is None:
        return None  # nothing that names a file: not ours to judge
    relative = workspace_relative(path, context.workspace, event.get("cwd"))
    if relative is None:
        return f"{path} is outside this task's workspace ({context.workspace}); edit files inside it only"
    try:
        with ClaimStore.open(Path(context.store_db)) as store:
            store.touch(relative, context.holder)
    except ClaimConflict as exc:
        return (
            f"{exc}. Leave {relative} alone: work around it, or say in your final answer that you could not."
        )
    return None


def record_span(event: dict[str, Any], context: HookContext) -> None:
    """Open the tool call's write span (PreToolUse) or close it (after the call). A Bash command left
    running in the background may write after its call: its span stays open."""
    tool_input = event.get("tool_input")
    background = isinstance(tool_input, dict) and tool_input.get("run_in_background") is True
    holder, now = context.holder, time.time_ns()
    name = str(event.get("tool_use_id") or f"unnamed-{now}")  # a call without an id: its span stays open
    with ClaimStore.open(Path(context.store_db)) as store:
        if event.get("hook_event_name") in SPAN_ENDS:
            if not background:
                store.close_span(holder.run_id, holder.attempt_id, name, now)
        else:
            store.open_span(holder.run_id, holder.attempt_id, name, now)


def deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    event: dict[str, Any] = {}
    try:
        if len(args) != 1:
            raise ValueError("usage: python -m stellafleet.pipelines.claude_hook CONTEXT.json")
        loaded = json.loads(sys.stdin.read() or "{}")
        if not isinstance(loaded, dict):
            raise ValueError("the hook input is not a JSON object")
        event = loaded
        context = HookContext.read(Path(args[0]))
        if event.get("hook_event_name") in SPAN_ENDS:
            record_span(event, context)
            return 0
        reason = decide(event, context)
        if reason is None:
            record_span(event, context)
    except Exception as exc:  # fail closed: only a deny decision stops the edit
        if event.get("hook_event_name") in SPAN_ENDS:
            return 0  # the call is over: its span stays open, which covers it to the attempt's end
        checked = (
            "when this command may write"
            if event.get("tool_name") == "Bash"
            else "the file claim for this edit"
        )
        reason = f"stella could not check {checked} ({type(exc).__name__}: {exc})"
    if reason is not None:
        print(json.dumps(deny(reason)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
