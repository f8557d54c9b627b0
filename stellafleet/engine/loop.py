"""The step loop: model call -> tool calls -> results -> repeat; limits checked before every call."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stellafleet.core.clock import Clock
from stellafleet.core.errors import StellaError
from stellafleet.core.pricing import Pricer
from stellafleet.core.spend import SpendTally
from stellafleet.core.words import plural
from stellafleet.engine.clients import ModelClient
from stellafleet.engine.errors import EngineError, Finished, FormatError, LimitReached, Parked, ToolFailure
from stellafleet.engine.messages import (
    AssistantTurn,
    Message,
    ModelReply,
    ToolCall,
    ToolResult,
    ToolResults,
    UserText,
    text_size,
)
from stellafleet.engine.redact import Transcript
from stellafleet.engine.tools import Toolbox

EventSink = Callable[[str, dict[str, Any]], None]

# Tokens per character when a size is not known from the provider: generous, so the guard errs early.
CHARS_PER_TOKEN = 3.0

NUDGE = (
    "Reply with tool calls only. Use the tools to do the task, commit your files with `commit`, and call "
    "`finish` with a summary when you are done (or when you cannot go on)."
)


def system_prompt(workspace: str, *, shared: bool, shell: bool) -> str:
    sharing = (
        "Other workers may be editing other files in this same tree at the same time. Your first write "
        "to a file claims it for you; if another worker holds a file, the write fails naming the holder: "
        "leave that file alone and work around it, or finish and say what is blocked."
        if shared
        else "You work alone in this worktree, on your own branch."
    )
    shell_rule = (
        "A shell tool is available; prefer the file tools for edits, and never reset, check out, stash or "
        "clean the tree."
        if shell
        else "There is no shell: use the file, search and git tools."
    )
    return (
        "You are a coding agent working headless on one task in a git "
        f"repository.\nWorkspace: {workspace} (all paths are relative to it; nothing outside it can be "
        f"read or written).\n{sharing}\n{shell_rule}\n"
        "Work in small steps: look before you edit, keep changes to what the task needs, commit your "
        "files with the `commit` tool (only files you wrote can be committed), then call `finish` with a "
        "short summary of what you did. If the task cannot be done, call `finish` with success=false and "
        "say why. If you cannot go on without a person's decision, call `ask` with one question: the task "
        "waits for the answer."
    )


@dataclass
class EngineOutcome:
    success: bool
    summary: str
    stop: str  # finished | max_steps | wall_time | spend_guard | model_error
    error: str | None
    usd: float
    input_tokens: int
    output_tokens: int
    steps: int
    question: str | None = None  # parked: what it asked a person (`ask`)
    last_words: str = ""  # what the model said last


@dataclass(kw_only=True)
class Engine:
    client: ModelClient
    toolbox: Toolbox
    system: str
    max_steps: int
    max_wall_seconds: float
    max_output_tokens: int
    pricer: Pricer | None  # never None under a guard (the pipeline refuses to start without a price)
    spend: SpendTally  # the guarded tally: totals, and whether the next call fits under the guard
    transcript: Transcript
    clock: Clock
    events: EventSink
    messages: list[Message] = field(default_factory=list, init=False)
    steps: int = field(default=0, init=False)
    _known_tokens: int = field(default=0, init=False)  # the context size the provider reported last
    _known_upto: int = field(default=0, init=False)  # how many messages that size covers
    _started: float = field(default=0.0, init=False)

    def run(self, task: str, history: list[Message] | None = None, history_from: str = "") -> EngineOutcome:
        """The task's conversation from the start; with history (a follow-up's session, replay.py, read
        from the transcript history_from), that conversation goes on with task, only what is new."""
        self._started = self.clock.now()
        if history:
            self.messages = [*history, UserText(task)]
            self.transcript.write("resume", prompt=task, messages=len(history), **{"from": history_from})
        else:
            self.messages = [UserText(f"Task:\n{task}")]
            self.transcript.write("task", system=self.system, task=task, tools=list(self.toolbox.tools))
        try:
            while True:
                self.step()
        except Finished as done:
            outcome = self._outcome(done.success, done.summary or "(no summary)", "finished", None)
        except Parked as asked:
            text = f"parked: it asks: {asked.question}"
            outcome = self._outcome(False, text, "parked", text)
            outcome.question = asked.question
        except LimitReached as limit:
            outcome = self._outcome(False, limit.reason, limit.kind, limit.reason)
        except EngineError as exc:
            outcome = self._outcome(False, f"the model call failed: {exc}", "model_error", str(exc))
        self.transcript.write("end", **vars(outcome))
        self._emit("end", vars(outcome))
        return outcome

    def step(self) -> None:
        self.check_limits()
        reply = self.query()
        self.messages.append(reply.turn)
        if not reply.turn.tool_calls:
            self.messages.append(UserText(NUDGE))
            return
        results: list[ToolResult] = []
        try:
            for call in reply.turn.tool_calls:
                results.append(self.execute(call))
        finally:
            if results:
                self.messages.append(ToolResults(tuple(results)))

    def check_limits(self) -> None:
        if self.steps >= self.max_steps:
            raise LimitReached(
                "max_steps",
                f"stopped after {plural(self.steps, 'step')}: the step limit (engine.max_steps) was reached",
            )
        elapsed = self.clock.now() - self._started
        if elapsed >= self.max_wall_seconds:
            raise LimitReached(
                "wall_time",
                f"stopped after {elapsed:.0f} s: the wall-time limit of {self.max_wall_seconds:g} s "
                "was reached",
            )
        if self.spend.guarded and self.pricer is not None:
            worst = self.pricer.worst_case(self.context_tokens(), self.max_output_tokens)
            refused = self.spend.no_room_for(worst)
            if refused is not None:
                raise LimitReached(
                    "spend_guard",
                    f"stopped by the spend guard after {plural(self.steps, 'step')}: {refused}; to let it go "
                    f"on, lower [engine] max_output_tokens (now {self.max_output_tokens}), raise the spend "
                    "limit, or run fewer workers at once (each worker's guard is the limit divided by "
                    "the concurrency)",
                )

    def context_tokens(self) -> int:
        """The next request's size in tokens: the last reported size plus an estimate of what came after."""
        extra = text_size(self.messages[self._known_upto :])
        if not self._known_tokens:
            extra += len(self.system) + sum(
                len(str(s.parameters)) + len(s.description) for s in self.toolbox.specs
            )
        return self._known_tokens + math.ceil(extra / CHARS_PER_TOKEN)

    def query(self) -> ModelReply:
        self._emit("model_call", {"step": self.steps + 1})
        reply = self.client.complete(self.system, self.messages, self.toolbox.specs, self.max_output_tokens)
        usage = reply.usage
        usd = self.pricer.cost(usage) if self.pricer is not None else 0.0
        self.steps += 1
        self.spend.add(usd, steps=1, **usage.to_json())
        if usage.input_tokens:
            self._known_tokens = usage.input_tokens + usage.output_tokens
            self._known_upto = len(self.messages) + 1  # this reply is counted in output_tokens
        self.transcript.write(
            "model",
            step=self.steps,
            text=reply.turn.text,
            tool_calls=[asdict(c) for c in reply.turn.tool_calls],
            usage=usage.to_json(),
            usd=usd,
            stop_reason=reply.stop_reason,
        )
        self._emit("step", {"step": self.steps, "usd": self.spend.usd, "text": reply.turn.text})
        return reply

    def execute(self, call: ToolCall) -> ToolResult:
        """One tool call; every failure becomes an error result the model can read."""
        is_error = True
        try:
            try:
                args = call.parsed()
            except ValueError as exc:
                raise FormatError(
                    f"{call.name}: the arguments are not valid JSON ({exc}); send a JSON object"
                ) from None
            content = self.toolbox.call(call.name, args)
            is_error = False
        except Finished:
            self.transcript.write(
                "tool", step=self.steps, name=call.name, arguments=call.arguments, result="finished"
            )
            raise
        except Parked:  # the answer comes as the next message when its session goes on
            said = "asked: the answer comes as the next message"
            self.transcript.write(
                "tool", step=self.steps, name=call.name, arguments=call.arguments, result=said
            )
            raise
        except (ToolFailure, StellaError) as exc:
            content = f"error: {exc}"
        except OSError as exc:
            content = f"error: {exc.strerror or exc}"
        except Exception as exc:  # a bug in a tool must not end the attempt
            content = f"error: {call.name} failed unexpectedly: {type(exc).__name__}: {exc}"
        record = {"step": self.steps, "name": call.name, "arguments": call.arguments, "result": content}
        self.transcript.write("tool", **record, is_error=is_error)
        self._emit("tool", {**record, "is_error": is_error})
        return ToolResult(call.id, content, is_error)

    def _emit(self, kind: str, data: dict[str, Any]) -> None:
        """Hand an event to the sink, keys masked as in the transcript."""
        redact = self.transcript.redact
        self.events(kind, {k: redact(v) if isinstance(v, str) else v for k, v in data.items()})

    def _outcome(self, success: bool, summary: str, stop: str, error: str | None) -> EngineOutcome:
        pending = list(self.toolbox.workspace.uncommitted)
        if pending and stop == "finished":
            summary += f"\n(left uncommitted: {', '.join(pending)})"
        return EngineOutcome(
            success=success,
            summary=summary,
            stop=stop,
            error=error,
            usd=self.spend.usd,
            input_tokens=self.spend.input_tokens,
            output_tokens=self.spend.output_tokens,
            steps=self.steps,
            last_words=next((m.text for m in reversed(self.messages) if isinstance(m, AssistantTurn)), ""),
        )
