"""Claude Code's permission decisions, served to it as an MCP tool (`--permission-prompt-tool
mcp__stella__permit`) by this small server, started for each Claude Code worker. A tool request the task
was allowed (its allow-list, or a person's `stella answer --allow`) is allowed; any other parks the task:
the request is written to the park file and refused for now with Claude Code's turn interrupted, so it
ends with its result and cost, and the pipeline reports the attempt parked (its session kept: the answer
continues it).

    python -m stellafleet.pipelines.permit STATE_DIR

STATE_DIR holds `allowed.json` (what a person allowed: [{"tool", "input"}]) and receives `park.json`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stellafleet.core import jsontext

SERVER = "stella"
TOOL = "permit"
PROMPT_TOOL = f"mcp__{SERVER}__{TOOL}"  # the name Claude Code is given
ALLOWED_FILE = "allowed.json"
PARK_FILE = "park.json"
# what Claude Code is told of a parked request: refused for now, and its turn interrupted (it ends, with
# its result and cost; the answer comes as the next message of the session)
PARKED_ANSWER = jsontext.dumps(
    {
        "behavior": "deny",
        "message": "stella: this needs a person's permission; the task is parked until they answer.",
        "interrupt": True,
    }
)


def allows(allowed: Sequence[Mapping[str, Any]], tool: str, given: Mapping[str, Any]) -> bool:
    """Whether a person allowed this request: the tool for the rest of the task, or for Bash, that one
    command."""
    for entry in allowed:
        if entry.get("tool") != tool:
            continue
        if tool != "Bash":
            return True
        earlier = entry.get("input")
        if isinstance(earlier, dict) and earlier.get("command") == given.get("command"):
            return True
    return False


def read_allowed(state: Path) -> list[dict[str, Any]]:
    try:
        found = json.loads((state / ALLOWED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []


def park(state: Path, tool: str, given: Mapping[str, Any]) -> None:
    """Write the request that parks the task (the first one only), whole or not at all."""
    target = state / PARK_FILE
    if target.exists():
        return
    partial = state / f".{PARK_FILE}.{os.getpid()}"
    partial.write_text(jsontext.dumps({"tool": tool, "input": dict(given)}), encoding="utf-8")
    os.replace(partial, target)


def decide(state: Path, tool: str, given: Mapping[str, Any]) -> str:
    """Claude Code's answer (JSON text): allowed, or refused for now with the task parked."""
    if allows(read_allowed(state), tool, given):
        return jsontext.dumps({"behavior": "allow", "updatedInput": dict(given)})
    park(state, tool, given)
    return PARKED_ANSWER


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m stellafleet.pipelines.permit STATE_DIR", file=sys.stderr)
        return 2
    state = Path(args[0])
    from mcp.server.mcpserver import MCPServer  # the MCP SDK: only in this process

    server: Any = MCPServer(SERVER)

    @server.tool(
        name=TOOL,
        description="Decides whether a tool call may go ahead (stella fleet).",
        structured_output=False,
    )
    def permit(tool_name: str, input: dict[str, Any], tool_use_id: str | None = None) -> str:
        return decide(state, tool_name, input)

    server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
