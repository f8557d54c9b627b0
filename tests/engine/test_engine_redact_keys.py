"""A configured key of any shape is masked everywhere the engine writes, not only keys shaped `sk-...`.

The fallback pattern only knows `sk-...` keys; a gateway token of another shape stays out of transcripts,
logs, the ledger and the output only because the engine registers the configured key itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine import make_repo

from stellafleet.cli import main
from stellafleet.engine.redact import Redactor
from stellafleet.testing.model_server import ScriptedModelServer

GATEWAY_TOKEN = "corp.gw~Zq9XbT4mW2pLk7Vd8RfY"  # no `sk-` prefix: the fallback pattern misses it


def test_the_fallback_pattern_alone_would_miss_this_key() -> None:
    assert Redactor()(f"token {GATEWAY_TOKEN}") == f"token {GATEWAY_TOKEN}"
    assert Redactor([GATEWAY_TOKEN])(f"token {GATEWAY_TOKEN}") == "token [redacted]"


def test_a_configured_key_of_any_shape_lands_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for var in ("STELLA_SPEND_LIMIT", "STELLA_MODEL", "STELLA_BASE_URL", "STELLA_PROVIDER", "STELLA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CORP_GATEWAY_TOKEN", GATEWAY_TOKEN)
    leaky = [
        {
            "text": f"The gateway token is {GATEWAY_TOKEN}.",
            "tool_calls": [{"name": "write_file", "arguments": {"path": "k.txt", "content": "nothing\n"}}],
        },
        {"tool_calls": [{"name": "finish", "arguments": {"summary": f"done; token {GATEWAY_TOKEN}"}}]},
    ]
    with ScriptedModelServer(leaky) as server:
        (repo / ".stella").mkdir(exist_ok=True)
        (repo / ".stella/config.toml").write_text(
            f'[engine]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n'
            'api_key_env = "CORP_GATEWAY_TOKEN"\nmax_retries = 0\n'
        )
        assert main(["run", "Write k.txt"]) == 0
    assert server.requests[0].headers["authorization"] == f"Bearer {GATEWAY_TOKEN}"  # really used
    captured = capsys.readouterr()
    private = repo / ".stella/private"
    written = b"".join(p.read_bytes() for p in sorted(private.rglob("*")) if p.is_file())
    assert GATEWAY_TOKEN.encode() not in written
    assert GATEWAY_TOKEN not in captured.out + captured.err
    assert b"[redacted]" in written
