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

import sys
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
    "--disable",
    "--enable",
    "-o",
}


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
        message = fa.commit_message(CLI, commit)
        command = f"bash -lc '{fa.commit_command(message, edited)}'"
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
        done = fa.stella_commit(CLI, message, edited, cwd)
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
    if fa.answers_version(args, VERSION, ("--version", "-V")):
        return 0
    if not args or args[0] not in ("exec", "e"):
        sys.stderr.write("fake codex only does `codex exec`\n")
        return 2
    options, positional = fa.parse_args(args[1:], VALUE_OPTIONS)
    cwd = Path(options.get("-C") or options.get("--cd") or ".").resolve()
    prompt = positional[-1] if positional else None
    if prompt == "-":  # as the real one: the prompt is read from stdin
        prompt = sys.stdin.read()
    script = fa.begin(CLI, args, cwd=cwd, options=options, prompt=prompt)
    if not options.get("--json"):
        sys.stderr.write("fake codex only speaks --json\n")
        return 2
    ended = fa.crash_or_garble(
        CLI, script, stderr="Error: fake codex crashed", garbage="codex: this is not a JSON event"
    )
    if ended is not None:
        return ended
    mode = str(script.get("mode", "success"))
    items = Items()
    fa.emit({"type": "thread.started", "thread_id": str(uuid.uuid4())})
    fa.emit({"type": "turn.started"})
    if fa.spawn_or_hang(CLI, script):
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
    fa.pause(script, "hold_s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
