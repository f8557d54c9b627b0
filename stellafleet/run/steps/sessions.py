"""Sessions: every follow-up (a check round, a --fix-ci round, an eviction's fix, --resume, --from-salvage,
an answer) continues the task's agent session when its pipeline can, with only what is new as its prompt;
a new session otherwise, and the attempt says why (its `session_start` fact). The worker learns which in
its `resume` fact (pipelines/sessions.py); each pipeline reports the session it ran in as `session`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stellafleet.pipelines.sessions import RESUME, SESSION, SESSION_START, short_id
from stellafleet.run.steps import AttemptState, AttemptStep, RunSettings
from stellafleet.state.ledger import Ledger

# the pipelines whose agent can go on in a session (the command pipeline has none)
RESUMABLE = frozenset({"plain", "claude-code", "codex", "aider"})
CONTINUE = (
    "Your earlier attempt at this task stopped before it was done. Look at where the work stands, "
    "finish the task and commit it, and end with a short summary."
)


@dataclass(frozen=True)
class Choice:
    """A follow-up's session: the `resume` fact the worker is handed (None: a new session) and why."""

    resume: Mapping[str, Any] | None
    said: str


def choose(
    earlier: tuple[str, Mapping[str, Any]] | None, pipeline: str, *, max_tokens: int, new: Mapping[str, Any]
) -> Choice:
    """Continue the earlier session (its pipeline, its `session` fact) or start a new one, and why; new:
    what the follow-up sends ({"prompt": text}, or {"tail": n}: the prompt's last n characters)."""
    if earlier is None:
        return Choice(None, "new session: the task has no earlier session")
    made_by, session = earlier
    session_id, tokens = str(session.get("id") or ""), session.get("tokens")
    size = tokens if isinstance(tokens, int) else 0
    if made_by != pipeline:
        return Choice(None, f"new session: the last one was {made_by}'s, this attempt runs {pipeline}")
    if not session_id:
        return Choice(None, "new session: the last one left no id")
    if size > max_tokens:
        return Choice(None, f"new session: the last one is over resume_max_tokens ({size:,})")
    resume = {"id": session_id, "cwd": session.get("cwd") or "", "tokens": size, **new}
    return Choice(resume, f"resumed session {short_id(session_id)} ({size:,} tokens)")


class Sessions(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger

    def before_start(self, attempt: AttemptState) -> None:
        """A follow-up's choice, as facts of this attempt (set before its worker is handed the task's)."""
        ctx = attempt.ctx
        if ctx.pipeline not in RESUMABLE:
            return
        runs = self.ledger.runs.lineage(self.settings.run_id)
        found = self.ledger.facts.latest(runs, attempt.task.id, SESSION)
        if attempt.request is None and found is None:
            return  # the task's first attempt: a new session, nothing to say
        context = attempt.request.follow_up.context if attempt.request is not None else ""
        # the context ends the attempt's prompt (the dispatcher puts it there): the worker cuts it off
        new = {"tail": len(context)} if context.strip() else {"prompt": CONTINUE}
        earlier = (found[1], found[2]) if found is not None and isinstance(found[2], dict) else None
        max_tokens = self.settings.config.fleet.resume_max_tokens
        choice = choose(earlier, ctx.pipeline, max_tokens=max_tokens, new=new)
        self.ledger.facts.set(ctx.attempt_id, RESUME, choice.resume)  # None: not the last one's either
        self.ledger.facts.set(ctx.attempt_id, SESSION_START, choice.said)
