"""Issue 49 item 10: a failed or killed shared task's edits stay in the user's tree (salvaged). `stella
restore` puts back to HEAD only the files that still hold exactly what was salvaged; `stella merge`, its
--dry-run and a fleet's claims refusal name them as a failed task's leftovers (with the salvage ref), not as
the user's changes; `stella fleet --estimate` runs nothing and does not refuse."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.merging import build_run
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.git.salvage import salvage, salvage_ref
from stellafleet.state.claims import ClaimStore, Holder

REF = salvage_ref("r-20261201-040000-dead", "t1", 3)


def _failed_task_left(root: Path) -> None:
    """What a failed shared task's attempt leaves: README.md edited, new.txt created (staged), salvaged."""
    (root / "README.md").write_text("# half of the task's edit\n")
    (root / "new.txt").write_text("the task's new file\n")
    git("add", "new.txt", cwd=root)
    assert salvage(root, REF, paths=["README.md", "new.txt"], message="salvage") is not None


def test_restore_puts_back_only_what_the_failed_task_left(git_repo: Path, stella_main: StellaRunner) -> None:
    (git_repo / "mine.txt").write_text("mine\n")
    git("add", "mine.txt", cwd=git_repo)
    git("commit", "-qm", "mine", cwd=git_repo)
    _failed_task_left(git_repo)
    (git_repo / "mine.txt").write_text("my own edit\n")  # the user's: never touched

    dry = stella_main("restore", "--dry-run", "--json", cwd=git_repo)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["restored"] == [
        {"path": "README.md", "salvage_ref": REF},
        {"path": "new.txt", "salvage_ref": REF},
    ]
    assert (git_repo / "new.txt").exists()  # a dry run changes nothing

    proc = stella_main("restore", cwd=git_repo)
    assert proc.returncode == 0, proc.stderr
    assert (
        "put back to HEAD: README.md, new.txt: left by task t1 of run r-20261201-040000-dead" in proc.stdout
    )
    assert git("status", "--porcelain", cwd=git_repo) == " M mine.txt\n"
    assert (git_repo / "mine.txt").read_text() == "my own edit\n"
    assert git("rev-parse", REF, cwd=git_repo)  # the salvage stays


def test_a_leftover_the_user_changed_again_is_theirs(git_repo: Path, stella_main: StellaRunner) -> None:
    _failed_task_left(git_repo)
    (git_repo / "README.md").write_text("# the task's edit, then mine\n")
    proc = stella_main("restore", cwd=git_repo)
    assert proc.returncode == 0
    assert (git_repo / "README.md").read_text() == "# the task's edit, then mine\n"
    assert not (git_repo / "new.txt").exists()


def test_merge_names_a_failed_tasks_leftovers_and_its_dry_run_says_it_will_refuse(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    build_run(git_repo)
    _failed_task_left(git_repo)
    proc = stella_main("merge", "--unwatched", cwd=git_repo)
    assert proc.returncode == 2
    assert "uncommitted changes" not in proc.stderr  # nothing of the user's is dirty
    assert (
        "a failed task's leftovers, not changes of yours (README.md, new.txt: left by task t1" in proc.stderr
    )
    assert f"(salvaged as {REF})" in proc.stderr and "`stella restore`" in proc.stderr

    dry = stella_main("merge", "--unwatched", "--dry-run", cwd=git_repo)
    assert dry.returncode == 2  # as the real merge would
    assert (
        "\nthe real merge will refuse (exit 2): your work tree holds a failed task's leftovers" in dry.stdout
    )

    (git_repo / "mine.txt").write_text("mine\n")
    git("add", "mine.txt", cwd=git_repo)
    both = stella_main("merge", "--unwatched", cwd=git_repo)
    assert "uncommitted changes (1 file: mine.txt): commit or stash them; your work tree holds" in both.stderr


def test_a_fleet_names_claimed_leftovers_and_its_estimate_does_not_refuse(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    _failed_task_left(git_repo)
    plan = git_repo.parent / "plan.toml"
    plan.write_text('[[tasks]]\nid = "t1"\nprompt = "p"\npipeline = "command"\nclaims = ["README.md"]\n')
    (git_repo / ".stella").mkdir()
    (git_repo / ".stella" / "config.toml").write_text('[pipelines.command]\nrun = "true"\n')
    refused = stella_main("fleet", "--plan", str(plan), cwd=git_repo)
    assert refused.returncode == 2
    assert "claimed files hold a failed task's leftovers, not changes of yours (README.md" in refused.stderr
    assert "of yours: README.md" not in refused.stderr

    estimate = stella_main("fleet", "--estimate", "--plan", str(plan), cwd=git_repo)
    assert estimate.returncode == 0, estimate.stderr


def test_a_running_tasks_claimed_file_is_never_put_back(git_repo: Path, stella_main: StellaRunner) -> None:
    """A task resumed from its leftovers holds exactly what was salvaged while it runs: it keeps them."""
    _failed_task_left(git_repo)
    paths = StatePaths(git_repo)
    paths.private.mkdir(parents=True, exist_ok=True)
    with ClaimStore.open(paths.store_db) as store:
        store.acquire(["README.md"], Holder.current("r-20261201-050000-beef", "t1", "", 7, pid=os.getpid()))
    proc = stella_main("restore", cwd=git_repo)
    assert proc.returncode == 0
    assert 'kept README.md: claimed by running task "t1"' in proc.stderr
    assert (git_repo / "README.md").read_text() == "# half of the task's edit\n"
    assert not (git_repo / "new.txt").exists()  # not claimed: put back
