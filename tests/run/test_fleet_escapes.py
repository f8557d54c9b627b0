"""Titles and summaries from plans and models are shown, never obeyed: control characters print escaped.

Printed raw, `\\033[2J` in a title cleared the user's screen and `\\033]0;...\\007` in a summary set the
terminal's window title, in `stella fleet`'s live and plain output and in `stella runs`.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

from helpers.fleet import Scripts, write_config
from helpers.repo import StellaRunner

CLEAR = "\x1b[2J"
SET_TITLE = "\x1b]0;pwned\x07"
PLAN = '[[tasks]]\nid = "evil"\ntitle = "evil \\u001b[2J title"\nprompt = "p"\n'
SUMMARY = 'report(summary="done \\x1b]0;pwned\\x07 [bold]x[/] \\u202e")'


def injected(text: str) -> list[str]:
    return [seq for seq in (CLEAR, SET_TITLE, "\x07", "\u202e") if seq in text]


def fleet_in_a_terminal(repo: Path, plan: Path) -> str:
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command"],
        cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, timeout=120,
    )  # fmt: skip
    os.close(follower)
    reader.join(10)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode(errors="replace")


def test_control_characters_in_titles_and_summaries_print_escaped(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("evil", SUMMARY))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)

    plain = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert injected(plain.stdout) == [] and "\x1b" not in plain.stdout
    assert "done \\x1b]0;pwned\\x07 [bold]x[/] \\u202e" in plain.stdout

    live = fleet_in_a_terminal(git_repo, plan)
    assert injected(live) == [], repr(live)
    assert "\\x1b]0;pwned\\x07" in live and "[bold]x[/]" in live  # shown, markup included

    for args in (("runs",), ("runs", "latest")):
        shown = stella_main(*args, cwd=git_repo, env={"COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert injected(shown.stdout) == [] and "\x1b" not in shown.stdout, repr(shown.stdout)
    detail = stella_main("runs", "latest", cwd=git_repo).stdout
    assert "evil \\x1b[2J title" in detail and "\\x1b]0;pwned\\x07" in detail


def test_plan_show_list_and_info_print_titles_and_prompts_escaped(
    tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "evil"\ntitle = "evil \\u001b[2J title\\nforged line"\n'
        'prompt = "p \\u001b]0;pwned\\u0007 \\u202e"\npipeline = "command"\n'
    )
    for args in (("show", str(plan)), ("list", str(plan)), ("info", str(plan), "evil")):
        shown = stella_main("plan", *args, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert injected(shown.stdout) == [] and "\x1b" not in shown.stdout, (args, shown.stdout)
        assert "evil \\x1b[2J title" in shown.stdout, (args, shown.stdout)
        assert not any(line.startswith("forged") for line in shown.stdout.splitlines()), shown.stdout
    assert "\\x1b]0;pwned\\x07" in stella_main("plan", "info", str(plan), "evil", cwd=tmp_path).stdout


def test_a_summary_with_newlines_cannot_forge_a_line_of_stella_runs(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    forged = 'report(summary="done\\n  t9  succeeded  forged\\n      error: none\\r\\x1b[2K")'
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("forge", forged))
    assert stella_main("fleet", "--pipeline", "command", "one", cwd=git_repo).returncode == 0
    shown = stella_main("runs", "latest", cwd=git_repo, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "      summary: done t9 succeeded forged error: none\\x0d\\x1b[2K" in lines, shown.stdout
    assert not any(line.lstrip().startswith(("t9", "error: none")) for line in lines), shown.stdout


def test_the_notify_warning_shows_the_commands_stderr_on_one_line_escaped(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    write_config(
        git_repo,
        run="true",
        extra="[notify]\ncommand = \"printf 'no\\\\033[2J hook\\\\nstella: error: forged\\\\n' >&2; "
        'exit 7"\n',
    )
    proc = stella_main("fleet", "--pipeline", "command", "fine", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stderr
    assert "notify command exited 7 (run_ended): no\\x1b[2J hook stella: error: forged" in proc.stderr
    assert not any(line.startswith("stella: error") for line in proc.stderr.splitlines()), proc.stderr


def test_colour_codes_in_a_summary_are_dropped_and_other_escapes_still_shown(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    """vitest colours its last lines: dim, bold and green around `Tests  3 passed`."""
    vitest = 'report(summary="\\x1b[2m Tests \\x1b[22m\\x1b[1m\\x1b[32m3 passed\\x1b[39m\\x1b[22m \\x1b[2J!")'
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("vitest", vitest))
    proc = stella_main("fleet", "--json", "--pipeline", "command", "run the tests", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["tasks"][0]["summary"] == " Tests 3 passed \x1b[2J!"  # as recorded
    shown = stella_main("runs", "latest", cwd=git_repo, env={"COLUMNS": "200"}).stdout
    assert "summary: Tests 3 passed \\x1b[2J!" in shown, shown
