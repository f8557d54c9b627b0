"""`stella run PROMPT`: one engine worker in this tree, recorded as a one-task run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.engine import HELLO_SESSION, make_repo

from stellafleet.cli import main
from stellafleet.git import gitops
from stellafleet.testing.model_server import ScriptedModelServer

SECRET = "sk-test-SECRET-1234567890"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for var in ("STELLA_SPEND_LIMIT", "STELLA_MODEL", "STELLA_BASE_URL", "STELLA_PROVIDER", "STELLA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return root


def write_config(root: Path, base_url: str, *, provider: str = "openai", extra: str = "") -> None:
    (root / ".stella").mkdir(exist_ok=True)
    (root / ".stella/config.toml").write_text(
        f'[engine]\nprovider = "{provider}"\nmodel = "scripted"\nbase_url = "{base_url}"\n'
        f"max_retries = 0\n{extra}"
    )


def ledger_rows(root: Path, sql: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(root / ".stella/private/fleet.db")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def everything_written(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((root / ".stella/private").rglob("*")) if p.is_file())


SESSION = HELLO_SESSION


def test_run_records_a_one_task_run_and_prints_progress(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedModelServer(SESSION) as server:
        write_config(
            repo,
            server.openai_base_url,
            extra='[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n',
        )
        assert main(["--spend-limit", "1", "run", "Add hello.txt"]) == 0
    out = capsys.readouterr().out
    assert "step   1" in out and "write_file hello.txt" in out and "commit Add hello.txt" in out
    assert "succeeded in 3 steps" in out and "Added hello.txt." in out
    (run,) = ledger_rows(repo, "SELECT * FROM runs")
    assert (run["status"], run["exit_code"], run["pipeline"], run["max_concurrency"]) == (
        "succeeded",
        0,
        "plain",
        1,
    )
    assert run["spend_limit_usd"] == 1.0
    (task,) = ledger_rows(repo, "SELECT * FROM tasks")
    assert (task["id"], task["status"], task["prompt"]) == ("t1", "succeeded", "Add hello.txt")
    (attempt,) = ledger_rows(repo, "SELECT * FROM attempts")
    assert attempt["success"] == 1 and attempt["summary"] == "Added hello.txt." and attempt["steps"] == 3
    expected = (6500 * 3 + 190 * 15) / 1e6
    assert attempt["spend_usd"] == pytest.approx(expected) and run["spend_usd"] == pytest.approx(expected)
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (6500, 190)
    (commit,) = ledger_rows(repo, "SELECT * FROM commits")
    assert commit["sha"] == gitops.head_commit(repo) and commit["task_id"] == "t1"
    assert Path(attempt["transcript_path"]).is_file() and Path(attempt["log_path"]).is_file()
    assert gitops.status_porcelain(repo) == ["?? .stella/"]  # only the config; private state is excluded


def test_run_json_and_a_failed_task_exit_1(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = [{"tool_calls": [{"name": "finish", "arguments": {"summary": "cannot", "success": False}}]}]
    with ScriptedModelServer(script) as server:
        write_config(repo, server.anthropic_base_url, provider="anthropic")
        assert main(["run", "--json", "Do the impossible"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["success"] is False and document["summary"] == "cannot" and document["task_id"] == "t1"
    (attempt,) = ledger_rows(repo, "SELECT success, outcome FROM attempts")
    assert tuple(attempt) == (0, "failed")


def test_no_model_configured_is_exit_2_before_anything_runs(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "Do it"]) == 2
    assert "no model configured" in capsys.readouterr().err
    assert not (repo / ".stella/private/fleet.db").exists()


def test_missing_key_for_a_remote_model_is_exit_2(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    write_config(repo, "https://api.openai.com/v1")
    assert main(["run", "Do it"]) == 2
    assert "set OPENAI_API_KEY" in capsys.readouterr().err


def test_spend_limit_without_a_price_is_exit_2_saying_how_to_set_one(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedModelServer([]) as server:
        write_config(repo, server.openai_base_url)
        assert main(["--spend-limit", "2", "run", "Do it"]) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert '[prices."scripted"]' in err and "input_per_mtok" in err and ".stella/config.toml" in err


def test_the_api_key_lands_nowhere(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    leaky = [
        {
            "text": f"My key is {SECRET}.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "k.txt", "content": "no key here\n"}}
            ],
        },
        {"tool_calls": [{"name": "finish", "arguments": {"summary": f"done; the key was {SECRET}"}}]},
    ]
    with ScriptedModelServer(leaky) as server:
        write_config(repo, server.openai_base_url)
        assert main(["run", "Write k.txt"]) == 0
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # the key was really used
    captured = capsys.readouterr()
    written = everything_written(repo)
    assert b"transcripts" in b"".join(str(p).encode() for p in (repo / ".stella/private").rglob("*.jsonl"))
    assert SECRET.encode() not in written and SECRET not in captured.out + captured.err
    assert b"[redacted]" in written  # the attempt's summary and the transcript say a key was masked

    # A failing run whose error body echoes the key: the error says what failed, without the key.
    echo = [{"error": {"status": 401, "body": f"Incorrect API key provided: {SECRET}"}}]
    with ScriptedModelServer(echo) as server:
        write_config(repo, server.openai_base_url)
        assert main(["run", "Write k.txt"]) == 1
    captured = capsys.readouterr()
    assert "HTTP 401" in captured.out and "Incorrect API key provided" in captured.out
    assert SECRET not in captured.out + captured.err
    assert SECRET.encode() not in everything_written(repo)
    failed = ledger_rows(repo, "SELECT summary, error FROM attempts WHERE success = 0")
    assert len(failed) == 1 and "HTTP 401" in failed[0]["error"] and SECRET not in failed[0]["error"]


def test_a_fleet_worker_runs_the_engine_and_reports_spend_as_it_goes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedModelServer(SESSION) as server:
        write_config(
            repo,
            server.openai_base_url,
            extra='[prices."scripted"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n',
        )
        assert main(["--spend-limit", "1", "fleet", "Add hello.txt"]) == 0
    (attempt,) = ledger_rows(repo, "SELECT * FROM attempts")
    assert (
        attempt["pipeline"] == "plain"
        and attempt["success"] == 1
        and attempt["summary"] == "Added hello.txt."
    )
    assert attempt["spend_usd"] == pytest.approx((6500 * 3 + 190 * 15) / 1e6) and attempt["steps"] == 3
    events = ledger_rows(repo, "SELECT usd FROM spend_events ORDER BY id")
    assert [round(e["usd"], 6) for e in events] == [0.0075, 0.00735, 0.0075]  # one per model call
    (commit,) = ledger_rows(repo, "SELECT * FROM commits")
    assert commit["sha"] == gitops.head_commit(repo) and commit["message"] == "Add hello.txt"
    assert "step   1" in Path(attempt["log_path"]).read_text()


def _run_in_a_process(repo: Path, prompt: str, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "run", prompt],
        cwd=repo,
        text=True,
        **popen,  # type: ignore[call-overload]
    )


SLOW_SESSION: list[dict[str, Any]] = [
    SESSION[0],
    {**SESSION[1], "delay": 3},  # the model is "thinking" when the terminal goes away
    SESSION[2],
]


def test_a_hangup_ends_the_run_interrupted_not_running_forever(repo: Path) -> None:
    # Closing the terminal sends SIGHUP, whose default action killed `stella run` on the spot: the run, its
    # task and its attempt stayed `running` in the ledger for good.
    with ScriptedModelServer(SLOW_SESSION) as server:
        write_config(repo, server.openai_base_url)
        proc = _run_in_a_process(repo, "Add hello.txt", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not (repo / "hello.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    (run,) = ledger_rows(repo, "SELECT status, exit_code FROM runs")
    (attempt,) = ledger_rows(repo, "SELECT outcome, finished_at_ms FROM attempts")
    (task,) = ledger_rows(repo, "SELECT status FROM tasks")
    assert tuple(run) == ("interrupted", 130) and task["status"] == "interrupted"
    assert attempt["outcome"] == "interrupted" and attempt["finished_at_ms"] is not None


def test_a_reader_that_goes_away_does_not_fail_the_run(repo: Path) -> None:
    # `stella run ... | head -1`: the progress lines once failed the engine run with a BrokenPipeError.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with ScriptedModelServer(SESSION) as server:
        write_config(repo, server.openai_base_url)
        proc = _run_in_a_process(repo, "Add hello.txt", stdout=write_end, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    os.close(write_end)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "internal error" not in err
    (attempt,) = ledger_rows(repo, "SELECT outcome, summary FROM attempts")
    assert tuple(attempt) == ("succeeded", "Added hello.txt.")
