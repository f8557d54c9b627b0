"""An agent's session as an attempt fact: what a pipeline reports of the session it ran in (`session`),
and a follow-up's instruction to continue one (`resume`, set by the fleet's step run/steps/sessions.py),
read from the worker's STELLA_FACTS."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FACTS_VAR = "STELLA_FACTS"  # what the worker's task learned so far (JSON, the ledger's attempt_facts)
SESSION = "session"  # fact: {"id", "cwd", "tokens"} of the session an attempt ran in
# fact: {"id", "cwd", "tokens", "prompt" or "tail"} the session this attempt continues (None: a new one)
RESUME = "resume"
SESSION_START = "session_start"  # fact: how its session started, in words (`resumed session ...`)
# fact: what a parked attempt waits on: {"kind": "tool" | "question", "tool", "input", "question",
# "last_words"} from its worker, with "item" (the answer request's id) from the fleet
PARKED = "parked"
ALLOWED = "allowed_tools"  # fact: the tool requests a person allowed the task ({"tool", "input"} each)


def task_facts(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The facts the fleet handed this worker (STELLA_FACTS); {} when none or unreadable."""
    raw = (os.environ if env is None else env).get(FACTS_VAR, "")
    try:
        facts = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return facts if isinstance(facts, dict) else {}


@dataclass(frozen=True)
class Resume:
    """A follow-up's instruction: continue session `id` (made in `cwd`) with only `prompt`, what is new."""

    id: str
    cwd: str
    tokens: int
    prompt: str

    @classmethod
    def of(cls, task_prompt: str, env: Mapping[str, str] | None = None) -> Resume | None:
        """The instruction in this worker's facts, or None: a new session with the whole task. What is
        new is the fact's own `prompt`, or the last `tail` characters of the task's prompt (a follow-up's
        context, which the fleet puts at its end: a large one never travels in the environment)."""
        wanted = task_facts(env).get(RESUME)
        if not isinstance(wanted, dict) or not isinstance(wanted.get("id"), str) or not wanted["id"]:
            return None
        tokens, tail = wanted.get("tokens"), wanted.get("tail")
        prompt = str(wanted.get("prompt") or "")
        if not prompt and isinstance(tail, int) and tail > 0:
            prompt = task_prompt[-tail:]
        return cls(
            wanted["id"], str(wanted.get("cwd") or ""), tokens if isinstance(tokens, int) else 0, prompt
        )


def short_id(session_id: str) -> str:
    """How a session is named to people: a file's name (aider's history, the engine's transcript), else
    the first 8 characters of the agent's own id."""
    return Path(session_id).name if "/" in session_id else f"{session_id[:8]}..."


def session_fact(session_id: str, cwd: Path, tokens: int) -> dict[str, Any]:
    """The `session` fact a pipeline reports: its agent's session id, where it was made, its context size."""
    return {"id": session_id, "cwd": str(cwd), "tokens": max(0, int(tokens))}


def fresh_after_failed_resume(resume: Resume, why: str) -> dict[str, Any]:
    """The facts of an attempt whose resume failed at run time and that went on in a new session."""
    return {SESSION_START: f"new session: session {resume.id[:8]}... could not be resumed ({why})"}
