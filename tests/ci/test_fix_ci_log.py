"""--fix-ci's failure excerpt: the failed runs' `--log-failed` output, its end kept within the limit."""

from __future__ import annotations

from pathlib import Path

from stellafleet.ci.gh import CiRun, GitHub
from stellafleet.ci.prtext import failure_excerpt, trim_log
from stellafleet.testing.fake_gh import FakeGh


def ci_run(run_id: int, conclusion: str, name: str = "build") -> CiRun:
    url = f"https://github.com/octo/widgets/actions/runs/{run_id}"
    return CiRun(run_id, 1, "completed", conclusion, "", url, name, "CI")


def test_trim_log_keeps_the_end_cut_at_a_line_and_says_how_much_went() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    trimmed = trim_log(text, 40)
    assert trimmed.endswith("line 99") and "line 0\n" not in trimmed
    head, _, kept = trimmed.partition("\n")
    assert head.startswith("[... ") and head.endswith(" earlier bytes left out ...]")
    assert len(kept.encode()) <= 40 and kept.startswith("line ")
    assert trim_log("short\n", 40) == "short"


def test_a_log_of_exactly_the_limit_comes_back_whole() -> None:
    text = "".join(f"é line {i}\n" for i in range(4))  # "é" is two bytes: the limit counts bytes
    size = len(text.encode())
    assert trim_log(text, size) == text.strip("\n") and "left out" not in trim_log(text, size)
    assert "left out" in trim_log(text, size - 1)  # one byte less and the first line goes


def test_a_failure_excerpt_of_exactly_the_limit_comes_back_whole(tmp_path: Path) -> None:
    github = GitHub(FakeGh({"logs": {"7": "test\tpytest\tE assert 1 == 2\n"}}), tmp_path)
    whole = failure_excerpt(github, [ci_run(7, "failure")], 10_000)
    assert failure_excerpt(github, [ci_run(7, "failure")], len(whole.encode())) == whole
    assert "left out" not in whole


def test_only_failed_runs_logs_are_fetched_each_under_its_label(tmp_path: Path) -> None:
    gh = FakeGh({"logs": {"7": "test\tpytest\tE assert 1 == 2\n", "*": "lint\truff\tE501\n"}})
    github = GitHub(gh, tmp_path)
    runs = [ci_run(7, "failure"), ci_run(8, "success", "docs"), ci_run(9, "timed_out", "lint")]
    text = failure_excerpt(github, runs, 10_000)
    url = "https://github.com/octo/widgets/actions/runs/7"
    assert f"== CI / build (failure) {url}\ntest\tpytest\tE assert 1 == 2" in text
    assert "== CI / lint (timed_out)" in text and "E501" in text and "docs" not in text
    assert [call[:3] for call in gh.calls] == [["run", "view", "7"], ["run", "view", "9"]]
    assert all("--log-failed" in call for call in gh.calls)


def test_a_log_gh_cannot_fetch_is_named_not_fatal(tmp_path: Path) -> None:
    github = GitHub(FakeGh({"logs": {}}), tmp_path)
    text = failure_excerpt(github, [ci_run(5, "failure")], 10_000)
    assert "(could not fetch the log: gh run view 5 --log-failed failed: failed to get run: HTTP 404" in text
