"""`plain`: the built-in engine as a pipeline."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path

from stellafleet import __version__
from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.limits import limits_of
from stellafleet.core.pricing import Pricer, price_for, unknown_price_message
from stellafleet.core.spend import SpendReporter, SpendTally
from stellafleet.core.workercontext import WorkerContext
from stellafleet.engine.clients import make_client
from stellafleet.engine.loop import NUDGE, Engine, EngineOutcome, EventSink, system_prompt
from stellafleet.engine.redact import Redactor, Transcript
from stellafleet.engine.replay import conversation
from stellafleet.engine.settings import EngineSettings, load_settings, settings_problems
from stellafleet.engine.tools import SECRET_ENV, ClaimFn, LeaveOpen, SpanFn, Toolbox, Workspace
from stellafleet.git.lane import commit_paths
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.sessions import PARKED, Resume, fresh_after_failed_resume, session_fact
from stellafleet.pipelines.support import ProgressPrinter
from stellafleet.state.claims import ClaimStore, Holder

SPEND_ENV = ("STELLA_SPEND_LIMIT", "STELLA_SPEND_GUARD")
_HOW_TO_PRICE = 'set [prices."MODEL"] input_per_mtok and output_per_mtok in .stella/config.toml'


def _pricer(settings: EngineSettings, config: Config, *, needed: bool) -> Pricer | None:
    pricer = price_for(settings.model, config, provider=settings.provider)
    if pricer is None and needed:
        raise StellaError(unknown_price_message(settings.model, config.settings_file), exit_code=EXIT_USAGE)
    return pricer


class PlainPipeline:
    name = "plain"
    description = "the built-in engine: a step loop with file, search, git and commit tools"

    def preflight(
        self,
        config: Config,
        *,
        spend_limited: bool | None = None,
        model: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str | None:
        """None when ready; else what to configure: a model, its key, its price when spend is limited."""
        env = os.environ if env is None else env
        if spend_limited is None:
            spend_limited = any(env.get(name) for name in SPEND_ENV)
        try:
            problems = settings_problems(config, model=model, env=env)
            if not problems and spend_limited:
                _pricer(load_settings(config, model=model, env=env), config, needed=True)
        except StellaError as exc:
            problems = [str(exc)]
        return "; ".join(problems) or None

    def version(self) -> str | None:
        return __version__

    def run(
        self,
        ctx: WorkerContext,
        config: Config,
        spend: SpendReporter,
        *,
        clock: Clock | None = None,
        events: EventSink | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PipelineResult:
        """Run the engine on ctx's task; a bad config raises StellaError (exit 2) before any model call."""
        env = os.environ if env is None else env
        settings = load_settings(config, model=ctx.model, env=env)
        tally = SpendTally.for_attempt(ctx, spend)
        pricer = _pricer(settings, config, needed=tally.guarded)
        redact = Redactor([settings.api_key(env), *(env.get(name) for name in SECRET_ENV)])
        toolbox = _toolbox(ctx, settings, env)
        transcript = _start_transcript(ctx, settings, redact, priced=pricer is not None)
        client = make_client(settings, clock=clock, redact=redact, env=env, limits=limits_of(spend))
        wall = min(settings.max_wall_seconds, math.inf if ctx.timeout_s is None else ctx.timeout_s)
        engine = Engine(
            client=client,
            toolbox=toolbox,
            system=system_prompt(str(ctx.workspace), shared=ctx.shared, shell=settings.shell),
            max_steps=settings.max_steps,
            max_wall_seconds=wall,
            max_output_tokens=settings.max_output_tokens,
            pricer=pricer,
            spend=tally,
            transcript=transcript,
            clock=clock or SystemClock(),
            events=events or ProgressPrinter(sys.stdout),  # a fleet worker's stdout is its log
        )
        resume = Resume.of(ctx.prompt, env)
        history = conversation(Path(resume.id), NUDGE) if resume is not None else []
        try:
            if resume is not None and history:
                outcome = engine.run(resume.prompt, history, history_from=resume.id)
            else:
                outcome = engine.run(ctx.prompt)
        finally:
            client.close()
        result = _result(outcome, redact)
        result.facts["session"] = session_fact(
            str(ctx.transcript_path), ctx.workspace, engine.context_tokens()
        )
        if outcome.question is not None:  # it asked a person: the fleet parks it (run/steps/park.py)
            parked = {"kind": "question", "question": outcome.question, "last_words": outcome.last_words}
            result.facts[PARKED] = parked
        if resume is not None and not history:
            result.facts.update(fresh_after_failed_resume(resume, "its transcript is gone"))
        return result


def _toolbox(ctx: WorkerContext, settings: EngineSettings, env: Mapping[str, str]) -> Toolbox:
    """The attempt's tools: commits through the lane and, in a shared tree, claims taken on write and
    write spans recorded."""
    shared = ctx.shared
    return Toolbox(
        Workspace(
            ctx.workspace,
            claim=_implicit_claims(ctx) if shared else None,
            span=_write_spans(ctx) if shared else None,
        ),
        committer=partial(commit_paths, ctx),
        shell=settings.shell,
        shell_timeout=settings.shell_timeout,
        env=env,
        secret_env=(settings.api_key_env, *SECRET_ENV),
        plan_out=ctx.plan_out,
    )


def _start_transcript(
    ctx: WorkerContext, settings: EngineSettings, redact: Redactor, *, priced: bool
) -> Transcript:
    transcript = Transcript(ctx.transcript_path, redact)
    transcript.write(
        "start", run=ctx.run_id, task=ctx.task_id, attempt=ctx.attempt_id, settings=settings.public()
    )
    if not priced:
        note = f"no price known for model {settings.model!r}: spend is recorded as $0 ({_HOW_TO_PRICE})"
        transcript.write("warning", message=note)
        print(f"stella: {note}", file=sys.stderr, flush=True)
    return transcript


def _result(outcome: EngineOutcome, redact: Redactor) -> PipelineResult:
    return PipelineResult(
        success=outcome.success,
        summary=redact(outcome.summary),
        error=None if outcome.error is None else redact(outcome.error),
        spend_usd=outcome.usd,
        input_tokens=outcome.input_tokens,
        output_tokens=outcome.output_tokens,
        steps=outcome.steps,
    )


def _implicit_claims(ctx: WorkerContext) -> ClaimFn:
    holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id)

    def claim(rel: str) -> None:
        with ClaimStore.open(ctx.paths.store_db) as store:
            store.touch(rel, holder)

    return claim


def _write_spans(ctx: WorkerContext) -> SpanFn:
    """Each call of a tool that can write the tree, recorded as a write span of the attempt (the shared
    tree's writes are attributed by them, run/steps/unclaimed.py); a call the worker's end cuts off, or
    one whose command left processes running, stays open, which counts as lasting to the attempt's end."""
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.report_spans(ctx.run_id, ctx.attempt_id)
    calls = itertools.count(1)

    @contextlib.contextmanager
    def span() -> Iterator[LeaveOpen]:
        name = f"engine-{next(calls)}"
        with ClaimStore.open(ctx.paths.store_db) as store:
            store.open_span(ctx.run_id, ctx.attempt_id, name, time.time_ns())
        left_open: list[bool] = []
        try:
            yield lambda: left_open.append(True)
        finally:
            if not left_open:
                with ClaimStore.open(ctx.paths.store_db) as store:
                    store.close_span(ctx.run_id, ctx.attempt_id, name, time.time_ns())

    return span
