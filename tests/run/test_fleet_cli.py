"""`stella fleet` options and refusals: --json, --dry-run, inline prompts, and clear exit-2 errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers.fleet import by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops


def test_inline_prompts_become_tasks_t1_t2_and_json_prints_one_result_document(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    write_config(
        git_repo,
        run='echo "working on: $STELLA_PROMPT"',
        tasks={
            "t2": 'echo "{\\"spend_usd\\": 0.25, \\"summary\\": \\"second done\\"}" '
            '> "$STELLA_COMMAND_RESULT"'
        },
    )
    proc = stella_main(
        "fleet", "--json", "--pipeline", "command", "Add unit tests for the parser", "Document src/api/",
        cwd=git_repo,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the document on stdout
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0
    assert re.fullmatch(r"r-\d{8}-\d{6}-[0-9a-f]{4}", doc["run_id"])
    tasks = by_id(doc["tasks"])
    assert list(tasks) == ["t1", "t2"]
    assert tasks["t1"]["title"] == "Add unit tests for the parser"
    assert tasks["t1"]["summary"] == "working on: Add unit tests for the parser"
    assert tasks["t2"]["summary"] == "second done"
    assert tasks["t2"]["spend_usd"] == 0.25 and doc["spend_usd"] == 0.25
    attempt = tasks["t1"]["attempts"][0]
    assert attempt["outcome"] == "succeeded" and attempt["exit_code"] == 0
    assert attempt["cpu_seconds"] is not None and attempt["peak_rss_bytes"] > 1_000_000
    log = Path(attempt["log_path"]).read_text().splitlines()
    assert "working on: Add unit tests for the parser" in log  # the command's output lands in the log
    assert doc["run_id"] == run_record(git_repo)["run"]["id"]


def test_dry_run_shows_waves_and_workspaces_without_running_or_recording(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "schema"\nprompt = "p"\nclaims = ["a.rs"]\n\n'
        '[[tasks]]\nid = "reader"\nprompt = "p"\ndepends_on = ["schema"]\n\n'
        '[[tasks]]\nid = "docs"\nprompt = "p"\ndepends_on = ["reader"]\nisolation = "isolated"\n'
    )
    write_config(git_repo, run="touch ran-for-real")
    proc = stella_main("fleet", "--dry-run", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "wave 1:\n  schema [command] shared tree; claims a.rs" in out
    assert "wave 2:\n  reader [command] shared tree; after schema" in out
    match = re.search(
        r"  docs \[command\] isolated: (\S+) on (fleet/docs-[0-9a-f]{16}) from base \w{7}; after reader", out
    )
    assert match, out
    assert match.group(1) == f".stella/worktrees/{match.group(2).removeprefix('fleet/')}"
    assert not (git_repo / "ran-for-real").exists()
    assert not StatePaths(git_repo).private.exists()
    assert gitops.git("branch", "--list", "fleet/*", "--format=%(refname:short)", cwd=git_repo).split() == []
    assert ".stella" not in (git_repo / ".git" / "info" / "exclude").read_text()

    as_json = stella_main(
        "fleet", "--dry-run", "--json", "--plan", str(plan), "--pipeline", "command", cwd=git_repo
    )
    doc = json.loads(as_json.stdout)
    assert doc["dry_run"] is True and doc["waves"] == [["schema"], ["reader"], ["docs"]]
    assert by_id(doc["tasks"])["docs"]["branch"].startswith("fleet/docs-")


def test_not_a_repository_is_one_clear_line_with_exit_2(tmp_path: Path, stella_main: StellaRunner) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = stella_main("fleet", "a prompt", cwd=plain)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not inside a git repository" in lines[0] and "Traceback" not in proc.stderr


def test_a_repository_without_commits_is_one_clear_line_with_exit_2(
    tmp_path: Path, stella_main: StellaRunner
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git("init", "-q", cwd=empty)
    proc = stella_main("fleet", "a prompt", cwd=empty)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no commits yet" in lines[0]
    assert not (empty / ".stella").exists()


def test_usage_errors_exit_2_and_run_nothing(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "p"\n')
    both = stella_main("fleet", "--plan", str(plan), "a prompt", cwd=git_repo)
    assert both.returncode == 2 and "not both" in both.stderr
    nothing = stella_main("fleet", cwd=git_repo)
    assert nothing.returncode == 2 and "nothing to run" in nothing.stderr
    unknown = stella_main("fleet", "--pipeline", "no-such-pipeline", "a prompt", cwd=git_repo)
    assert unknown.returncode == 2 and "unknown pipeline 'no-such-pipeline'" in unknown.stderr
    assert "command" in unknown.stderr  # lists what is installed
    unconfigured = stella_main("fleet", "--pipeline", "command", "a prompt", cwd=git_repo)
    assert unconfigured.returncode == 2
    assert "cannot start the fleet" in unconfigured.stderr and "[pipelines.command]" in unconfigured.stderr
    bad_base = stella_main("fleet", "--pipeline", "command", "--base-ref", "nope", "a prompt", cwd=git_repo)
    assert bad_base.returncode == 2
    misplaced = stella_main("fleet", "--spend-limit", "3", "a prompt", cwd=git_repo)
    assert misplaced.returncode == 2 and "stella --spend-limit 3 fleet" in misplaced.stderr
    invalid = tmp_path / "invalid.toml"
    invalid.write_text('[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["b"]\n')
    bad_plan = stella_main("fleet", "--plan", str(invalid), cwd=git_repo)
    assert bad_plan.returncode == 2 and 'unknown task "b"' in bad_plan.stderr
    assert "Traceback" not in bad_plan.stderr
    assert not StatePaths(git_repo).fleet_db.exists()


def test_base_ref_pins_isolated_work_to_that_commit(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    first = gitops.head_commit(git_repo)
    (git_repo / "later.txt").write_text("later\n")
    git("add", "later.txt", cwd=git_repo)
    git("commit", "-q", "-m", "later", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "iso"\nprompt = "p"\nisolation = "isolated"\n')
    write_config(git_repo, run="test ! -e later.txt && git rev-parse HEAD")
    proc = stella_main(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--base-ref", "HEAD~1", cwd=git_repo
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["base_commit"] == first and record["run"]["base_ref"] == "HEAD~1"
    assert by_id(record["tasks"])["iso"]["reason"] is None
    assert record["attempts"][0]["summary"] == first


def test_a_failed_task_gives_exit_1_and_the_ledger_query_of_the_guide_finds_it(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    import sqlite3

    write_config(
        git_repo, run='echo "$STELLA_TASK_ID: all good"', tasks={"t2": "echo 'it broke: no parser'; exit 3"}
    )
    proc = stella_main("fleet", "--pipeline", "command", "one", "two", cwd=git_repo)
    assert proc.returncode == 1
    assert "it broke: no parser" in proc.stdout
    conn = sqlite3.connect(StatePaths(git_repo).fleet_db)
    rows = conn.execute(
        """SELECT a.task_id, a.branch, a.summary
             FROM attempts a
            WHERE a.run_id = (SELECT id FROM runs ORDER BY created_at_ms DESC LIMIT 1)
              AND a.success = 0;"""
    ).fetchall()
    conn.close()
    assert rows == [("t2", None, "it broke: no parser")]
    attempt = by_id(run_record(git_repo)["attempts"], key="task_id")["t2"]
    assert attempt["exit_code"] == 1 and attempt["error"] == "command failed: exit status 3"


def test_the_default_engine_needs_a_model_and_under_a_spend_limit_a_price(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    no_model = stella_main("fleet", "a prompt", cwd=git_repo)
    assert no_model.returncode == 2 and "pipeline plain: no model configured" in no_model.stderr
    env = {"STELLA_MODEL": "house-model-7b", "OPENAI_API_KEY": "sk-test-not-real"}
    unpriced = stella_main("--spend-limit", "2", "fleet", "a prompt", cwd=git_repo, env=env)
    assert unpriced.returncode == 2
    assert "no price known for model 'house-model-7b' and a spend limit is set" in unpriced.stderr
    assert '[prices."house-model-7b"]' in unpriced.stderr
    assert "sk-test-not-real" not in unpriced.stderr + unpriced.stdout
    (git_repo / ".stella").mkdir(exist_ok=True)
    (git_repo / ".stella" / "config.toml").write_text(
        '[prices."house-model-7b"]\ninput_per_mtok = 0.1\noutput_per_mtok = 0.2\n'
    )
    priced = stella_main("--spend-limit", "2", "fleet", "--dry-run", "a prompt", cwd=git_repo, env=env)
    assert priced.returncode == 0, priced.stderr
    assert not StatePaths(git_repo).fleet_db.exists()


def test_a_terminal_gets_the_live_display_and_a_summary_table(git_repo: Path, isolated_home: Path) -> None:
    import os
    import pty
    import select
    import subprocess
    import sys

    write_config(git_repo, run='sleep 1; echo "done: $STELLA_TASK_ID"')
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--pipeline", "command", "--max-concurrency", "2",
         "first job", "second job"],
        cwd=git_repo, stdin=follower, stdout=follower, stderr=follower,
        env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the fleet exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert "stella fleet: max concurrency 2 (--max-concurrency)" in screen
    assert "2 running" in screen  # the live view: the wave and one line per running worker
    assert re.search(r"t1\s+\d+\.\ds\s+0 steps\s+\$0\.00\s+first job", screen)
    assert "┃ task" in screen and "summary / reason" in screen  # rich's summary table
    assert "done: t2" in screen


def test_quiet_output_and_the_default_pipeline_from_the_config(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    write_config(
        git_repo,
        run='echo "fine"',
        tasks={"t2": "echo broken; exit 1"},
        extra='[fleet]\npipeline = "command"\n',
    )
    proc = stella_main("-q", "fleet", "one", "two", "three", cwd=git_repo)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2, proc.stdout  # the failure and the final line, nothing else
    assert lines[0].strip().startswith("failed t2 after") and lines[0].endswith(
        "command failed: exit status 1: broken"
    )
    assert lines[1].startswith("run r-") and lines[1].endswith("1 failed, 2 succeeded; spend $0.00; exit 1")
    assert run_record(git_repo)["run"]["pipeline"] == "command"


def test_without_git_on_path_the_fleet_says_so(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    proc = stella_main("fleet", "a prompt", cwd=git_repo, env={"PATH": str(empty)})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "git is not installed or not on PATH" in lines[0]


def test_a_state_directory_stella_cannot_create_is_one_clear_line_with_exit_2(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="touch ran")
    private = StatePaths(git_repo).private
    private.write_text("the user's own file\n")  # where .stella/private/ should be

    proc = stella_main("fleet", "--pipeline", "command", "a prompt", cwd=git_repo)

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write stella's state" in lines[0] and str(private) in lines[0]
    assert private.read_text() == "the user's own file\n"
    assert not (git_repo / "ran").exists()


def test_a_lone_surrogate_or_a_mistyped_pipeline_stops_the_fleet_before_a_run_row(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    (git_repo / "s.json").write_text('{"tasks": [{"id": "a", "prompt": "fix \\ud800"}]}')
    proc = stella_main("fleet", "--plan", "s.json", cwd=git_repo)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        'stella: error: s.json: task "a": prompt: contains a lone surrogate (\\ud800), which is not text: '
        "write the character itself"
    )
    (git_repo / "p.toml").write_text('[[tasks]]\nid = "a"\nprompt = "p"\npipeline = "claud-code"\n')
    proc = stella_main("fleet", "--plan", "p.toml", cwd=git_repo)
    assert proc.returncode == 2
    assert 'p.toml: task "a": pipeline: unknown pipeline "claud-code" (did you mean "claude-code"?)' in (
        proc.stderr
    )
    assert not StatePaths(git_repo).fleet_db.exists()


def test_config_file_given_only_on_the_command_line_reaches_the_worker(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    # the project has no config: the command to run is in FILE only, so the worker must read FILE too
    given = tmp_path / "elsewhere.toml"
    given.write_text('[pipelines.command]\nrun = "echo ran the given file"\n')
    assert not StatePaths(git_repo).config_file.exists()
    proc = stella_main(
        "--config", str(given), "fleet", "--json", "--pipeline", "command", "one", cwd=git_repo
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert by_id(doc["tasks"])["t1"]["summary"] == "ran the given file"


def test_a_mistyped_pipeline_option_names_the_closest_installed_one(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    proc = stella_main("fleet", "--pipeline", "claud-code", "one", cwd=git_repo)
    assert proc.returncode == 2
    assert (
        "unknown pipeline 'claud-code' (did you mean \"claude-code\"?): installed pipelines are "
        in proc.stderr
    )
    assert not StatePaths(git_repo).fleet_db.exists()


def test_dry_run_with_watch_says_it_will_push_the_branch_shared_tasks_commit_on(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "fix"\nprompt = "p"\n')
    write_config(git_repo, run="touch ran-for-real")
    proc = stella_main(
        "fleet", "--dry-run", "--watch", "--plan", str(plan), "--pipeline", "command", cwd=git_repo
    )
    assert proc.returncode == 0, proc.stderr
    assert "--watch: will push main to origin (what shared tasks commit)" in proc.stdout
    assert not (git_repo / "ran-for-real").exists()
    isolated = tmp_path / "isolated.toml"
    isolated.write_text('[[tasks]]\nid = "fix"\nprompt = "p"\nisolation = "isolated"\n')
    quiet = stella_main(
        "fleet",
        "--dry-run",
        "--watch",
        "--json",
        "--plan",
        str(isolated),
        "--pipeline",
        "command",
        cwd=git_repo,
    )
    assert json.loads(quiet.stdout)["watch_pushes"] == []  # only its own branch, with a pull request
