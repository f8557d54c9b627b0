"""A fake `codex` for tests: `codex exec --json`, driven by a JSON script (see fake_agent).

It prints the JSONL events of the real CLI: thread.started, then per scripted turn turn.started,
item.started/item.completed (file_change, command_execution, agent_message) and turn.completed with
`usage` {input_tokens, cached_input_tokens, output_tokens}, running totals for the thread as the real CLI
reports them. `turns` lists those usages (one turn by default); `pause_s` sleeps after each
turn.completed, and each emitted turn is logged, so a test can see that a stop came before later turns.

Modes: `success` (default), `turn_failed`, `error` (a top-level error event), `malformed` (text that is
not JSON), `crash`, `hang`. Other keys: `message` (the final agent message), `edits`, `commit`.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from stellafleet.testing import fake_agent as fa

CLI = "codex"
VERSION = "codex-cli 0.46.0"
VALUE_OPTIONS = {
    "--sandbox",
    "-s",
    "-C",
    "--cd",
    "-m",
    "--model",
    "-c",
    "--config",
    "--output-last-message",
    "-o",
}


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    options: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in VALUE_OPTIONS:
            options[arg] = argv[i + 1]
            i += 2
        elif arg.startswith("-"):
            options[arg] = True
            i += 1
        else:
            positional.append(arg)
            i += 1
    return options, positional


class Items:
    def __init__(self) -> None:
        self.count = 0

    def next_id(self) -> str:
        self.count += 1
        return f"item_{self.count}"


def do_work(script: dict[str, Any], cwd: Path, items: Items) -> None:
    edited: list[str] = []
    for edit in script.get("edits", []):
        item_id = items.next_id()
        fa.write_file(cwd, edit["path"], edit.get("content", ""))
        edited.append(edit["path"])
        fa.emit(
            {
                "type": "item.completed",
                "item": {
                    "id": item_id,
                    "type": "file_change",
                    "changes": [{"path": str(cwd / edit["path"]), "kind": "add"}],
                    "status": "completed",
                },
            }
        )
    commit = script.get("commit")
    if commit and edited:
        item_id = items.next_id()
        message = str(commit.get("message", "fake codex work"))
        command = f"bash -lc 'stella commit -m {json.dumps(message)} {' '.join(edited)}'"
        fa.emit(
            {
                "type": "item.started",
                "item": {
                    "id": item_id,
                    "type": "command_execution",
                    "command": command,
                    "aggregated_output": "",
                    "status": "in_progress",
                },
            }
        )
        done = fa.stella_commit(message, edited, cwd)
        fa.log(CLI, "commit", exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)
        fa.emit(
            {
                "type": "item.completed",
                "item": {
                    "id": item_id,
                    "type": "command_execution",
                    "command": command,
                    "aggregated_output": done.stdout + done.stderr,
                    "exit_code": done.returncode,
                    "status": "completed" if done.returncode == 0 else "failed",
                },
            }
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--version" in args or "-V" in args:
        print(VERSION)
        return 0
    fa.on_sigterm(CLI)
    if not args or args[0] not in ("exec", "e"):
        sys.stderr.write("fake codex only does `codex exec`\n")
        return 2
    options, positional = parse(args[1:])
    cwd = Path(options.get("-C") or options.get("--cd") or ".").resolve()
    fa.log(
        CLI, "start", argv=args, cwd=str(cwd), options=options, prompt=positional[-1] if positional else None
    )
    script = fa.load_script(CLI)
    if not options.get("--json"):
        sys.stderr.write("fake codex only speaks --json\n")
        return 2
    mode = str(script.get("mode", "success"))
    if mode == "crash":
        return fa.crash(CLI, script, "Error: fake codex crashed")
    if mode == "malformed":
        fa.emit("codex: this is not a JSON event")
        return 0
    items = Items()
    fa.emit({"type": "thread.started", "thread_id": str(uuid.uuid4())})
    fa.emit({"type": "turn.started"})
    if script.get("spawn_child"):
        fa.spawn_sleeper(CLI)
    if mode == "hang":
        fa.hang(CLI)
        return 0
    if mode == "error":
        fa.emit(
            {"type": "error", "message": str(script.get("message", "stream disconnected before completion"))}
        )
        return 1
    if mode == "turn_failed":
        message = str(script.get("message", "You exceeded your current quota"))
        fa.emit({"type": "turn.failed", "error": {"message": message}})
        return 1
    do_work(script, cwd, items)
    turns = script.get("turns") or [
        {"input_tokens": 20000, "cached_input_tokens": 5000, "output_tokens": 800}
    ]
    for index, usage in enumerate(turns):
        if index:
            fa.emit({"type": "turn.started"})
        if index == len(turns) - 1:
            text = str(script.get("message", "Done."))
            fa.emit(
                {
                    "type": "item.completed",
                    "item": {"id": items.next_id(), "type": "agent_message", "text": text},
                }
            )
        # Logged before it is printed: a wrapper may stop us the moment it reads the event.
        fa.log(CLI, "turn_completed", index=index, usage=usage)
        fa.emit({"type": "turn.completed", "usage": usage})
        fa.pause(script)
    time.sleep(float(script.get("hold_s", 0) or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
