"""Park instead of deny: an attempt whose worker needs a person (a tool request outside the task's
allow-list, the engine's `ask`) ends `parked`, its worktree and session kept and its slot freed, with a
`needs_you` answer request (`stella inbox`, `stella answer`). The answered request is the task's next
attempt: at once while its fleet waits for answers (`[fleet] park_wait`), else by `stella fleet --resume`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from stellafleet.core import jsontext
from stellafleet.core.status import AttemptEnd, AttemptOutcome, FollowUpReason, RequestState
from stellafleet.git import gitops
from stellafleet.pipelines.sessions import ALLOWED, PARKED
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, FollowUp, Request, RunSettings
from stellafleet.state.ledger import Ledger

INPUT_CHARS = 300  # how much of a tool request's input the request's text shows


def waits_on(parked: Mapping[str, Any]) -> str:
    """What a parked attempt waits on, in one line: its question, or the tool it wants to run."""
    if parked.get("kind") == "question":
        return f"asks: {parked.get('question') or '?'}"
    shown = jsontext.dumps(parked.get("input"))
    shown = shown if len(shown) <= INPUT_CHARS else shown[:INPUT_CHARS] + "..."
    return f"wants to use {parked.get('tool') or '?'} {shown}"


def answer_command(item: object, parked: Mapping[str, Any]) -> str:
    """The command that answers a parked task's request."""
    how = '"your answer"' if parked.get("kind") == "question" else "--allow  (or --deny)"
    return f"stella answer {item} {how}"


def park_context(parked: Mapping[str, Any]) -> str:
    """The answer request's text: what it waits on and the agent's last words."""
    said = str(parked.get("last_words") or "").strip()
    return waits_on(parked) + (f"\n\nIts last words: {said}" if said else "")


def answer_prompt(kind: str, answer: str, parked: Mapping[str, Any]) -> str:
    """What the task's next attempt is told of the answer (all it is told when its session goes on)."""
    tool = parked.get("tool") or "that tool"
    if kind == "allow":
        return f"A person allowed {tool} for the rest of this task. Go on with what you were doing."
    if kind == "deny":
        why = f" ({answer})" if answer else ""
        return (
            f"A person denied {tool}{why}. Do not use it: find another way, or finish and say what is "
            "blocked."
        )
    return f"A person answered your question ({parked.get('question') or ''}):\n\n{answer}"


def parked_of(ledger: Ledger, row: Mapping[str, Any]) -> dict[str, Any]:
    """What the attempt an answer request came from waits on (its `parked` fact; {} for another request)."""
    source = row.get("from_attempt_id")
    if row.get("reason") != FollowUpReason.ANSWER or source is None:
        return {}
    parked = ledger.facts.of_attempt(int(source)).get(PARKED)
    return parked if isinstance(parked, dict) else {}


def answered_follow_up(ledger: Ledger, row: Mapping[str, Any]) -> FollowUp:
    """An answered request as the follow-up that serves it: the answer's prompt."""
    kind, answer = str(row.get("answer_kind") or "text"), str(row.get("answer") or "")
    return FollowUp(FollowUpReason.ANSWER, answer_prompt(kind, answer, parked_of(ledger, row)))


def still_parked(ledger: Ledger, row: Mapping[str, Any]) -> AttemptEnd:
    """The end of an attempt of a task whose answer has not come: parked again, on the same item (its
    park was told already: `again`)."""
    parked = {**parked_of(ledger, row), "item": row["id"], "again": True}
    text = f"still parked: {waits_on(parked)} (stella answer {row['id']})"
    return AttemptEnd(AttemptOutcome.PARKED, text, text, facts={PARKED: parked})


class Park(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        self._injected: dict[int, int] = {}  # id(attempt) -> the answered request it took up

    def admit(self, attempt: AttemptState) -> None:
        """A task's first attempt in a run (`--resume`) takes up the answer its earlier run got, first."""
        if attempt.request is not None:
            return
        runs = self.ledger.runs.lineage(self.settings.run_id)
        for row in self.ledger.requests.answers(runs, attempt.task.id, RequestState.ANSWERED):
            if self.ledger.requests.take_answered(int(row["id"])):
                follow_up = replace(
                    answered_follow_up(self.ledger, row), start_at=self._start_at(attempt, row)
                )
                attempt.request = Request(int(row["id"]), follow_up)  # its context: the dispatcher's to add
                self._injected[id(attempt)] = int(row["id"])
                return

    def _start_at(self, attempt: AttemptState, row: Mapping[str, Any]) -> str | None:
        """Where an isolated task's new worktree starts when it takes up an earlier run's answer (this run
        made none yet): its salvage with --from-salvage, else where the parked attempt's branch got to."""
        if attempt.task.isolation != "isolated" or row["run_id"] == self.settings.run_id:
            return None
        earlier = self.ledger.tasks.get(str(row["run_id"]), attempt.task.id) or {}
        tip = gitops.ref_commit(self.settings.root, earlier["branch"]) if earlier.get("branch") else None
        return self.settings.start_points.get(attempt.task.id) or tip or self.settings.base_commit

    def before_start(self, attempt: AttemptState) -> None:
        """A task still waiting on its answer (`stella fleet --resume` before it came) stays parked; what a
        person allowed the task so far reaches its worker (the permission server reads it)."""
        runs = self.ledger.runs.lineage(self.settings.run_id)
        waiting = self.ledger.requests.answers(runs, attempt.task.id, RequestState.NEEDS_YOU)
        if attempt.request is None and waiting:
            raise AttemptFailed(still_parked(self.ledger, waiting[-1]))
        allowed = [
            {"tool": p.get("tool"), "input": p.get("input")}
            for p in self.ledger.requests.allowed(runs, attempt.task.id)
            if isinstance(p, dict)
        ]
        if allowed:
            self.ledger.facts.set(attempt.ctx.attempt_id, ALLOWED, allowed)

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """A worker that stopped to wait on a person: the attempt `parked`, its answer request open."""
        parked = end.facts.get(PARKED)
        if not isinstance(parked, dict) or end.outcome != AttemptOutcome.FAILED:
            return end
        ctx = attempt.ctx
        item = self.ledger.requests.ask(
            ctx.run_id,
            ctx.task_id,
            FollowUpReason.ANSWER,
            park_context(parked),
            asked_by="worker",
            state=RequestState.NEEDS_YOU,
            from_attempt=ctx.attempt_id,
        )
        text = f"parked: {waits_on(parked)} (stella answer {item})"
        facts = {**end.facts, PARKED: {**parked, "item": item}}
        return replace(end, outcome=AttemptOutcome.PARKED, summary=text, error=text, facts=facts)

    def released(self, attempt: AttemptState) -> FollowUp | None:
        taken = self._injected.pop(id(attempt), None)
        if taken is not None and attempt.recorded is not None:
            self.ledger.requests.finish(taken, f"its attempt {attempt.recorded.outcome}")
        return None
