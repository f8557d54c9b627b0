"""run_agent's transcript: the CLI's stdout, line by line; one that cannot be written is said, not fatal."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.agents import make_context

from stellafleet.pipelines.clirun import run_agent

ECHO = ["/bin/sh", "-c", "echo one; echo two >&2; echo three"]


def test_the_cli_stdout_is_the_transcript(git_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "transcripts" / "t1.jsonl"
    ctx = dataclasses.replace(make_context(git_repo, pipeline="codex"), transcript_path=path)
    run = run_agent(ctx, ECHO)
    assert run.returncode == 0 and run.stdout_lines == ["one", "three"]
    assert path.read_text() == "one\nthree\n"


def test_a_transcript_that_cannot_be_written_is_said_and_the_output_still_read(
    git_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ctx = dataclasses.replace(make_context(git_repo, pipeline="codex"), transcript_path=blocker / "t1.jsonl")
    run = run_agent(ctx, ECHO)
    assert run.returncode == 0 and run.stdout_lines == ["one", "three"] and list(run.stderr_tail) == ["two"]
    assert f"stella: cannot write the transcript {blocker / 't1.jsonl'}: " in capsys.readouterr().err
