"""core/terminal.py's one_line: the one cutter of text to one line (pipelines' summaries, the engine's HTTP
errors, the live display)."""

from __future__ import annotations

from stellafleet.core.terminal import one_line
from stellafleet.pipelines.support import describe_call


def test_one_line_joins_escapes_and_cuts_within_its_limit() -> None:
    assert one_line("all\n  tests\tpassed", 40) == "all tests passed"
    assert one_line(None, 10) == ""
    assert one_line("\x1b[31mred\x1b[0m and \x1b]0;title\x07", 40) == "red and \\x1b]0;title\\x07"
    assert one_line("x" * 12, 12) == "x" * 12
    assert one_line("x" * 13, 12) == "x" * 9 + "..."  # the cut counts within the limit
    assert one_line("x" * 13, 12, cut="…") == "x" * 11 + "…"


def test_a_pipelines_tool_line_is_cut_as_before() -> None:
    assert describe_call("run_shell", '{"command": "pytest -q\\n  tests/"}') == "run_shell pytest -q tests/"
    assert (
        describe_call("read_file", '{"path": "' + "d/" * 50 + '"}', limit=20)
        == "read_file " + "d/" * 8 + "d..."
    )
