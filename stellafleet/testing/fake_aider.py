"""A fake `aider` for tests: `aider --message ...` or `--message-file FILE`, driven by a JSON script.

Like the real one with `--no-pretty`, it prints plain text ("Applied edit to PATH" per edited file and a
"Tokens: ... Cost: $X message, $Y session." line per model call), and with `--analytics-log FILE` it
appends one JSON line per event, a `message_send` event per model call carrying prompt_tokens,
completion_tokens, total_tokens, cost and the running total_cost.

Modes: `success` (default), `error` (prints an API error and makes no model call, exiting 0 as aider
does), `malformed` (a line in the analytics log that is not JSON), `crash` (a traceback and exit 1),
`hang`. Other keys: `calls` (`[{"prompt_tokens", "completion_tokens", "cost"}]`, one call by default),
`pause_s` (sleep after each call), `edits`, `reply`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from stellafleet.testing import fake_agent as fa

CLI = "aider"
VERSION = "aider 0.86.1"
VALUE_OPTIONS = {
    "--message",
    "--message-file",
    "--msg",
    "-m",
    "--model",
    "--analytics-log",
    "--chat-history-file",
    "--input-history-file",
    "--llm-history-file",
    "--edit-format",
}


class Analytics:
    def __init__(self, path: str | None, model: str) -> None:
        self.path = Path(path) if path else None
        self.model = model

    def event(self, name: str, **properties: Any) -> None:
        if self.path is None:
            return
        entry = {
            "event": name,
            "properties": {"main_model": self.model, **properties, "aider_version": VERSION.split()[-1]},
            "user_id": "00000000-0000-4000-8000-000000000000",
            "time": int(time.time()),
        }
        with self.path.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def garbage(self) -> None:
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write("this is not an analytics event\n")


def _message(options: dict[str, Any]) -> str | None:
    if options.get("--message-file"):
        return Path(options["--message-file"]).read_text(encoding="utf-8")
    message = options.get("--message") or options.get("--msg") or options.get("-m")
    return str(message) if message else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if fa.answers_version(args, VERSION):
        return 0
    options, _files = fa.parse_args(args, VALUE_OPTIONS)
    cwd = Path.cwd()
    message = _message(options)
    script = fa.begin(CLI, args, cwd=cwd, options=options, prompt=message)
    if not message:
        sys.stderr.write("fake aider only does --message or --message-file\n")
        return 2
    model = str(options.get("--model") or "gpt-4o")
    analytics = Analytics(options.get("--analytics-log"), model)
    analytics.event("launched")
    mode = str(script.get("mode", "success"))
    print(f"Aider v{VERSION.split()[-1]}")
    print(f"Main model: {model} with diff edit format")
    sys.stdout.flush()
    if mode == "crash":
        return fa.crash(
            CLI, script, "Traceback (most recent call last):\n  ...\nRuntimeError: fake aider crashed"
        )
    if fa.spawn_or_hang(CLI, script):
        return 0
    if mode == "error":
        print(str(script.get("reply", "litellm.AuthenticationError: OpenAIException - invalid api key")))
        sys.stdout.flush()
        analytics.event("exit", reason="Completed --message")
        return 0
    if mode == "malformed":
        analytics.garbage()
    total = 0.0
    calls = script.get("calls") or [{"prompt_tokens": 2400, "completion_tokens": 350, "cost": 0.0113}]
    for index, call in enumerate(calls):
        cost = float(call.get("cost", 0.0))
        total += cost
        prompt_tokens = int(call.get("prompt_tokens", 0))
        completion_tokens = int(call.get("completion_tokens", 0))
        if index == 0:
            for edit in script.get("edits", []):
                fa.write_file(cwd, edit["path"], edit.get("content", ""))
                print(f"Applied edit to {edit['path']}")
        print(
            f"Tokens: {prompt_tokens} sent, {completion_tokens} received. "
            f"Cost: ${cost:.4f} message, ${total:.4f} session."
        )
        sys.stdout.flush()
        fa.log(CLI, "message_send", index=index, cost=cost, total_cost=total)  # before a wrapper can react
        analytics.event(
            "message_send",
            edit_format="diff",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            cost=cost,
            total_cost=total,
        )
        fa.pause(script)
    analytics.event("exit", reason="Completed --message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
