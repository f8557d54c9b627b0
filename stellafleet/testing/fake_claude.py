"""A fake `claude` for tests: Claude Code's headless mode, driven by a JSON script (see fake_agent).

It prints `--output-format json` (one result object) or `stream-json` (system init, assistant/user
messages, then the result; needs --verbose like the real one). Around each file edit and Bash command it
runs the PreToolUse hooks of the `--settings` file whose matcher matches the tool, and honours a deny (JSON
`permissionDecision: "deny"` on stdout, or exit code 2 with the reason on stderr), then, once the tool ran,
the PostToolUse hooks.

Modes: `success` (default), `api_error` (subtype success with is_error), `error`
(error_during_execution), `max_budget` (error_max_budget_usd; also chosen on its own when the scripted
`cost` exceeds --max-budget-usd), `max_turns` (error_max_turns), `malformed` (prints text that is not
JSON), `crash` (stderr and a non-zero exit, no output), `hang` (sleeps until stopped).
Other keys: `cost`, `num_turns`, `result`, `usage`, `errors`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from stellafleet.testing import fake_agent as fa

CLI = "claude"
VERSION = "2.0.14 (Claude Code)"
VALUE_OPTIONS = {
    "--output-format",
    "--input-format",
    "--permission-mode",
    "--settings",
    "--max-budget-usd",
    "--max-turns",
    "--model",
    "--append-system-prompt",
    "--system-prompt",
    "--session-id",
    "--resume",
    "--permission-prompt-tool",
}
MULTI_OPTIONS = {
    "--mcp-config",
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
}


def load_settings(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    text = value if value.lstrip().startswith("{") else Path(value).read_text()
    settings = json.loads(text)
    return settings if isinstance(settings, dict) else {}


def run_hooks(settings: dict[str, Any], event: dict[str, Any], cwd: Path) -> str | None:
    """Run the matching hooks of the event (its hook_event_name) like Claude Code does; the deny reason,
    or None to go ahead."""
    for group in settings.get("hooks", {}).get(event["hook_event_name"], []):
        matcher = group.get("matcher") or "*"
        if matcher != "*" and not re.fullmatch(matcher, event["tool_name"]):
            continue
        for hook in group.get("hooks", []):
            if hook.get("type") != "command":
                continue
            done = subprocess.run(
                hook["command"],
                shell=True,
                input=json.dumps(event),
                capture_output=True,
                text=True,
                cwd=cwd,
                timeout=float(hook.get("timeout", 60)),
                check=False,
            )
            fa.log(CLI, "hook", tool=event["tool_name"], exit_code=done.returncode, stdout=done.stdout)
            if done.returncode == 2:
                return done.stderr.strip() or "blocked by hook"
            if done.returncode == 0 and done.stdout.strip():
                try:
                    output = json.loads(done.stdout)
                except ValueError:
                    continue
                specific = output.get("hookSpecificOutput", {}) if isinstance(output, dict) else {}
                if specific.get("permissionDecision") == "deny":
                    return str(specific.get("permissionDecisionReason") or "denied by hook")
    return None


class Session:
    def __init__(self, options: dict[str, Any], script: dict[str, Any], cwd: Path) -> None:
        self.options = options
        self.script = script
        self.cwd = cwd
        self.stream = options.get("--output-format") == "stream-json"
        # the session it was given (a new one's id, or the one it resumes), as the real CLI keeps it
        self.session_id = str(options.get("--resume") or options.get("--session-id") or uuid.uuid4())
        self.denials: list[dict[str, Any]] = []
        self.tool_id = 0
        self.started = time.monotonic()

    def say(self, message: dict[str, Any]) -> None:
        if self.stream:
            fa.emit({**message, "session_id": self.session_id, "uuid": str(uuid.uuid4())})

    def say_init(self) -> None:
        self.say(
            {
                "type": "system",
                "subtype": "init",
                "cwd": str(self.cwd),
                "tools": ["Read", "Write", "Edit", "Bash"],
                "mcp_servers": [],
                "model": self.options.get("--model", "claude-sonnet-4-5"),
                "permissionMode": self.options.get("--permission-mode", "default"),
            }
        )

    def tool(self, name: str, tool_input: dict[str, Any]) -> str:
        self.tool_id += 1
        tool_use_id = f"toolu_{self.tool_id:04d}"
        self.say(
            {
                "type": "assistant",
                "message": {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}],
                },
                "parent_tool_use_id": None,
            }
        )
        return tool_use_id

    def tool_result(self, tool_use_id: str, content: str, *, error: bool = False) -> None:
        self.say(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_use_id,
                            "content": content,
                            "is_error": error,
                        }
                    ],
                },
                "parent_tool_use_id": None,
            }
        )

    def hook_event(self, tool_name: str, tool_input: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
        """The PreToolUse event of a tool call, as Claude Code hands it to a hook."""
        return {
            "session_id": self.session_id,
            "transcript_path": str(self.cwd / ".fake-transcript.jsonl"),
            "cwd": str(self.cwd),
            "permission_mode": self.options.get("--permission-mode", "default"),
            "hook_event_name": "PreToolUse",
            "tool_name": tool_name,
            "tool_input": tool_input,
            "tool_use_id": tool_use_id,
        }

    def edit(self, relative: str, content: str, settings: dict[str, Any]) -> bool:
        target = self.cwd / relative
        tool_input = {"file_path": str(target), "content": content}
        tool_use_id = self.tool("Write", tool_input)
        event = self.hook_event("Write", tool_input, tool_use_id)
        reason = run_hooks(settings, event, self.cwd)
        if reason is not None:
            fa.log(CLI, "denied", path=relative, reason=reason)
            self.denials.append({"tool_name": "Write", "tool_use_id": tool_use_id, "tool_input": tool_input})
            self.tool_result(tool_use_id, reason, error=True)
            return False
        fa.write_file(self.cwd, relative, content)
        fa.log(CLI, "edited", path=relative)
        self.tool_result(tool_use_id, f"File created successfully at: {target}")
        response = {"filePath": str(target), "success": True}
        run_hooks(settings, {**event, "hook_event_name": "PostToolUse", "tool_response": response}, self.cwd)
        return True

    def result(
        self, subtype: str, *, is_error: bool, text: str | None, cost: float, turns: int
    ) -> dict[str, Any]:
        usage = self.script.get("usage") or {
            "input_tokens": 120,
            "cache_creation_input_tokens": 2000,
            "cache_read_input_tokens": 8000,
            "output_tokens": 450,
        }
        message: dict[str, Any] = {
            "type": "result",
            "subtype": subtype,
            "is_error": is_error,
            "duration_ms": int((time.monotonic() - self.started) * 1000),
            "duration_api_ms": 1000,
            "num_turns": turns,
            "session_id": self.session_id,
            "total_cost_usd": cost,
            "usage": usage,
            "modelUsage": {},
            "permission_denials": self.denials,
            "uuid": str(uuid.uuid4()),
        }
        if subtype == "success":
            message["result"] = text or ""
        else:
            message["errors"] = list(self.script.get("errors", []))
        return message


def usage_error(options: dict[str, Any]) -> int | None:
    """The exit code of the real CLI for options it refuses, or None when they are fine."""
    if not options.get("-p") and not options.get("--print"):
        sys.stderr.write("fake claude only does print mode (-p)\n")
        return 2
    if options.get("--output-format") == "stream-json" and not options.get("--verbose"):
        sys.stderr.write("Error: When using --print, --output-format=stream-json requires --verbose\n")
        return 1
    return None


def do_work(session: Session) -> list[str]:
    """The scripted edits (through the hooks) and commit; the paths that were edited."""
    script = session.script
    settings = load_settings(session.options.get("--settings"))
    fa.wait_for_file(script.get("wait_for"))
    edited: list[str] = []
    for edit in script.get("edits", []):
        if session.edit(edit["path"], edit.get("content", ""), settings):
            edited.append(edit["path"])
    fa.mark(script.get("mark"))
    fa.wait_for_file(script.get("wait_after"))
    commit = script.get("commit")
    if commit and edited:
        commit_message = fa.commit_message(CLI, commit)
        tool_input = {"command": fa.commit_command(commit_message, edited)}
        tool_use_id = session.tool("Bash", tool_input)
        event = session.hook_event("Bash", tool_input, tool_use_id)
        run_hooks(settings, event, session.cwd)  # nothing of stella's denies a Bash command
        done = fa.stella_commit(CLI, commit_message, edited, session.cwd)
        session.tool_result(tool_use_id, done.stdout + done.stderr, error=done.returncode != 0)
        after = "PostToolUse" if done.returncode == 0 else "PostToolUseFailure"
        run_hooks(settings, {**event, "hook_event_name": after}, session.cwd)
    return edited


def result_message(session: Session, edited: list[str]) -> dict[str, Any] | None:
    """The result object the script's mode calls for; None (said on stderr) for an unknown mode."""
    script, options = session.script, session.options
    mode = str(script.get("mode", "success"))
    cost = float(script.get("cost", 0.0123))
    turns = int(script.get("num_turns", 3))
    budget = options.get("--max-budget-usd")
    if mode == "success" and budget is not None and cost > float(budget):
        mode = "max_budget"
    text = str(script.get("result", "Done: " + (", ".join(edited) or "nothing to change")))
    if session.denials:
        text += f" ({len(session.denials)} edit(s) were refused)"
    if mode == "success":
        return session.result("success", is_error=False, text=text, cost=cost, turns=turns)
    if mode == "api_error":
        error_text = str(script.get("result", "API Error: 401 invalid x-api-key"))
        return session.result("success", is_error=True, text=error_text, cost=cost, turns=turns)
    if mode == "error":
        return session.result("error_during_execution", is_error=True, text=None, cost=cost, turns=turns)
    if mode == "max_budget":
        return session.result("error_max_budget_usd", is_error=True, text=None, cost=cost, turns=turns)
    if mode == "max_turns":
        limit = int(options.get("--max-turns", turns))
        return session.result("error_max_turns", is_error=True, text=None, cost=cost, turns=limit)
    sys.stderr.write(f"fake claude: unknown mode {mode!r}\n")
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if fa.answers_version(args, VERSION, ("--version", "-v")):
        return 0
    # The real CLI's variadic options take values up to the next option.
    options, positional = fa.parse_args(args, VALUE_OPTIONS, MULTI_OPTIONS)
    cwd = Path.cwd()
    # as the real one: with no prompt argument, the prompt is read from stdin
    prompt = positional[0] if positional else (sys.stdin.read() or None)
    script = fa.begin(CLI, args, cwd=cwd, options=options, prompt=prompt)
    refused = usage_error(options)
    if refused is not None:
        return refused
    ended = fa.crash_or_garble(
        CLI, script, stderr="Error: fake claude crashed", garbage="Claude says hello, but this is not JSON {"
    )
    if ended is not None:
        return ended
    session = Session(options, script, cwd)
    session.say_init()
    if fa.spawn_or_hang(CLI, script):
        return 0
    edited = do_work(session)
    fa.pause(script, "hold_s")
    message = result_message(session, edited)
    if message is None:
        return 2
    if options.get("--output-format", "text") in ("json", "stream-json"):
        fa.emit(message)
    else:
        fa.emit(message.get("result", ""))
    fa.log(CLI, "result", subtype=message["subtype"], cost=message["total_cost_usd"])
    return 1 if message["is_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
