"""What `stella fleet` records and says of a run: its pipeline, its base, its result document."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers.fleet import run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.run.prepare import FleetOptions, prepare

TWO_TASKS = '[[tasks]]\nid = "a"\nprompt = "Do a"\n\n[[tasks]]\nid = "b"\nprompt = "Do b"\n'


def test_the_run_records_the_plans_default_pipeline(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    """No --pipeline: the run's pipeline is the plan's `[defaults] pipeline` (not the config's `plain`),
    in the ledger, `stella runs` and the run's read model the dashboard shows."""
    write_config(git_repo, run="true")
    plan = tmp_path / "plan.toml"
    plan.write_text('[defaults]\npipeline = "command"\n\n' + TWO_TASKS)
    done = stella_main("fleet", "--plan", str(plan), cwd=git_repo)
    assert done.returncode == 0, done.stdout + done.stderr
    record = run_record(git_repo)
    assert record["run"]["pipeline"] == "command"
    listing = stella_main("runs", cwd=git_repo)
    row = next(line for line in listing.stdout.splitlines() if record["run"]["id"] in line)
    assert " command " in f" {row} ", listing.stdout
    shown = json.loads(stella_main("runs", record["run"]["id"], "--json", cwd=git_repo).stdout)
    assert shown["run"]["pipeline"] == "command"
    tasks = [task for wave in shown["waves"] for task in wave["tasks"]]
    assert [task["pipeline"] for task in tasks] == ["command", "command"]


def test_a_run_of_several_pipelines_is_mixed(git_repo: Path, tmp_path: Path, isolated_home: Path) -> None:
    write_config(git_repo, run="true")
    plan = tmp_path / "plan.toml"
    plan.write_text(TWO_TASKS.replace('prompt = "Do b"', 'prompt = "Do b"\npipeline = "command"'))
    options = FleetOptions(plan_path=str(plan), cwd=git_repo, dry_run=True)
    assert prepare(options).run_pipeline == "mixed"
    assert (
        prepare(
            FleetOptions(plan_path=str(plan), cwd=git_repo, dry_run=True, pipeline="command")
        ).run_pipeline
        == "command"
    )


def test_a_missing_setting_names_the_config_file_given(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    config = tmp_path / "other.toml"
    config.write_text("[fleet]\nmax_concurrency = 1\n")
    done = stella_main("--config", str(config), "fleet", "--pipeline", "command", "Do a", cwd=git_repo)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the command pipeline has no command: set it in {config} as" in done.stderr
    assert ".stella/config.toml" not in done.stderr
    done = stella_main("fleet", "--pipeline", "command", "Do a", cwd=git_repo)  # no --config: the project's
    assert "the command pipeline has no command: set it in .stella/config.toml as" in done.stderr


def test_a_command_ending_in_stella_commit_is_summarised_by_its_commit(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run='echo hi > x.txt && stella commit -m "Add x.txt" x.txt')
    done = stella_main("fleet", "--pipeline", "command", "Add x", cwd=git_repo)
    assert done.returncode == 0, done.stdout + done.stderr
    record = run_record(git_repo)
    (attempt,), (commit,) = record["attempts"], record["commits"]
    assert attempt["summary"] == f"committed {commit['sha'][:12]} Add x.txt"
    assert f"committed {commit['sha'][:12]} Add x.txt" in done.stdout


def _conflicted(repo: Path) -> None:
    """repo in the middle of a merge with a conflict in README.md."""
    git("checkout", "-q", "-b", "other", cwd=repo)
    (repo / "README.md").write_text("theirs\n")
    git("commit", "-q", "-am", "theirs", cwd=repo)
    git("checkout", "-q", "main", cwd=repo)
    (repo / "README.md").write_text("ours\n")
    git("commit", "-q", "-am", "ours", cwd=repo)
    merged = subprocess.run(["git", "merge", "other"], cwd=repo, capture_output=True, text=True)
    assert merged.returncode == 1 and (repo / ".git/MERGE_HEAD").exists(), merged.stdout


def test_an_unresolved_merge_is_warned_of_and_a_claim_on_its_conflict_refused(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write_config(git_repo, run="true")
    _conflicted(git_repo)
    done = stella_main("fleet", "--pipeline", "command", "Do a", cwd=git_repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "stella fleet: warning: the repository is in an unfinished merge (MERGE_HEAD) with unresolved "
        "conflicts in README.md: shared-tree tasks work and commit in the middle of it; finish it "
        "(`git merge --continue`) or abort it (`git merge --abort`) first"
    ) in done.stderr
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "Edit the readme"\nclaims = ["README.md"]\n')
    refused = stella_main("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "task 'a' claims 'README.md', which has unresolved merge conflicts" in refused.stderr
    git("merge", "--abort", cwd=git_repo)
    clean = stella_main("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr


def test_fleet_json_and_runs_json_share_the_run_header(git_repo: Path, stella_main: StellaRunner) -> None:
    write_config(git_repo, run="true")
    done = stella_main("fleet", "--pipeline", "command", "--json", "Do a", cwd=git_repo)
    assert done.returncode == 0, done.stderr
    fleet = json.loads(done.stdout)
    shown = json.loads(stella_main("runs", fleet["run"]["id"], "--json", cwd=git_repo).stdout)
    volatile = ("live", "duration_ms")  # the same run read a moment later
    assert {k: v for k, v in fleet["run"].items() if k not in volatile} == {
        k: v for k, v in shown["run"].items() if k not in volatile
    }
    # the earlier shape's top-level fields stay, the same values as run.*
    assert (fleet["run_id"], fleet["status"], fleet["exit_code"]) == (fleet["run"]["id"], "succeeded", 0)
