"""`--fix-ci N`: a branch that ends red gets follow-up attempts of its task, fed the failing CI log, in
its own worktree and branch; each is pushed and watched again, at most N rounds, under the spend limit.
The real gh against the local GitHub API server: its simulated CI fails a tree whose `.ci-result` says
failure, and `gh run view --log-failed` reads the failing step's lines from the run's log archive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fleet import Scripts, run_record, write_config
from helpers.realgh import GitHubHost
from helpers.repo import StellaRunner, git

PLAN = """\
[[tasks]]
id = "fixable"
prompt = "make work.txt say fixed"
isolation = "isolated"

[[tasks]]
id = "stubborn"
prompt = "make the tests pass"
isolation = "isolated"
"""

# First attempt: broken work. A follow-up (its prompt carries the CI log): the fixable task commits a
# "fix:" commit (which CI passes), the stubborn one another broken one. Every attempt dumps its prompt.
WORKER = """
prompts = sorted(MARKS.glob(f"prompt-{TASK}-*.txt"))
n = len(prompts) + 1
prompt = os.environ["STELLA_PROMPT"]
mark(f"prompt-{TASK}-{n}.txt", prompt)
mark(f"guard-{TASK}-{n}.txt", os.environ.get("STELLA_SPEND_GUARD", "none"))
follow_up = "Failing jobs' log" in prompt
# the task id in the text and subject: two tasks' identical commits would be one commit (one SHA)
text = "fixed" if (follow_up and TASK == "fixable") else f"{TASK}: broken {n}"
(WS / "work.txt").write_text(text + "\\n")
(WS / ".ci-result").write_text("success\\n" if text == "fixed" else "failure\\n")
subprocess.run(["git", "add", "work.txt", ".ci-result"], check=True)
subject = "fix: work.txt says fixed" if text == "fixed" else f"{TASK}: work attempt {n}"
subprocess.run(["git", "commit", "-q", "-m", subject], check=True)
report(spend_usd=float(os.environ.get("SPEND_EACH", "0.25")), summary=subject)
"""


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


@pytest.fixture
def fleet_repo(
    git_repo: Path, tmp_path: Path, marks: Path, host: GitHubHost, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    command = Scripts(tmp_path / "scripts").python("worker", WORKER)
    watch = f'[watch]\npoll_interval = 0.1\nfix_ci_log_bytes = 200\nrepo = "{host.repo_flag}"\n'
    write_config(git_repo, run=command, extra=watch)
    monkeypatch.setenv("MARKS", str(marks))
    (tmp_path / "plan.toml").write_text(PLAN)
    yield git_repo


def attempts_of(record: dict, task: str) -> list[dict]:
    return [a for a in record["attempts"] if a["task_id"] == task]


def test_fix_ci_fixes_one_branch_in_one_round_and_gives_up_on_the_other_after_two(
    fleet_repo: Path, tmp_path: Path, marks: Path, host: GitHubHost, stella_main: StellaRunner
) -> None:
    plan = str(tmp_path / "plan.toml")
    proc = stella_main(
        "fleet", "--json", "--watch", "--fix-ci", "2", "--plan", plan, "--pipeline", "command", cwd=fleet_repo
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    watched = {b["task_id"]: b for b in doc["watch"]["branches"]}
    assert watched["fixable"]["state"] == "green" and watched["fixable"]["fix_rounds"] == 1
    assert watched["stubborn"]["state"] == "red" and watched["stubborn"]["fix_rounds"] == 2
    assert "still red after 2 fix-ci rounds" in watched["stubborn"]["reason"]

    record = run_record(fleet_repo)
    fixable, stubborn = attempts_of(record, "fixable"), attempts_of(record, "stubborn")
    assert [a["reason"] for a in fixable] == [None, "ci-fix"]
    assert [a["reason"] for a in stubborn] == [None, "ci-fix", "ci-fix"]
    assert all(a["outcome"] == "succeeded" for a in fixable + stubborn)
    # the same worktree and branch every round
    assert len({(a["branch"], a["worktree"]) for a in stubborn}) == 1
    # every round's spend is the run's spend
    assert record["run"]["spend_usd"] == pytest.approx(0.25 * 5)
    # the fixed commit is what origin has, and CI saw it green
    ci = {row["task_id"]: row for row in record["ci"]}
    branch = ci["fixable"]["branch"]
    assert ci["fixable"]["state"] == "green"
    assert git("ls-remote", "origin", branch, cwd=fleet_repo).split()[0] == ci["fixable"]["head_sha"]
    assert git("log", "-1", "--format=%s", branch, cwd=fleet_repo).strip() == "fix: work.txt says fixed"

    # the failure text reached the follow-up's prompt, trimmed to its last bytes; the first had none
    first, second = (marks / "prompt-fixable-1.txt").read_text(), (marks / "prompt-fixable-2.txt").read_text()
    assert first == "make work.txt say fixed"
    assert second.startswith("make work.txt say fixed\n") and ".ci-result says failure at" in second
    assert "build\tRun tests\t" in second and "Process completed with exit code 1." in second
    # trimmed to its last 200 bytes: the step's first lines are left out
    assert "earlier bytes left out" in second and "##[group]Run python -m pytest" not in second
    assert "fix-up round 1 of at most 2" in (marks / "prompt-stubborn-2.txt").read_text()
    assert "fix-up round 2 of at most 2" in (marks / "prompt-stubborn-3.txt").read_text()
    assert not (marks / "prompt-stubborn-4.txt").exists()
    logs = [op for op in host.operations() if "/actions/runs/" in op and op.endswith("/logs")]
    assert len(logs) == 3  # one `gh run view --log-failed` per red round

    shown = stella_main("runs", "latest", cwd=fleet_repo)
    assert shown.stdout.count("ci-fix") == 4  # three fix-up attempts, and the branch left red waits on you
    assert "needs you   stubborn (ci-fix)" in shown.stdout


def test_spend_across_rounds_counts_toward_the_limit(
    fleet_repo: Path, tmp_path: Path, marks: Path, stella_main: StellaRunner
) -> None:
    (tmp_path / "plan.toml").write_text(PLAN.split("\n\n")[1])  # the stubborn task alone
    proc = stella_main(
        "--spend-limit", "1.0", "fleet", "--json", "--watch", "--fix-ci", "2",
        "--plan", str(tmp_path / "plan.toml"), "--pipeline", "command",
        cwd=fleet_repo, env={"SPEND_EACH": "0.6"},
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    [watched] = json.loads(proc.stdout)["watch"]["branches"]
    assert watched["fix_rounds"] == 2 and watched["state"] == "red"
    assert "spend limit reached: $1.20 of $1.00; no fix-up attempt" in watched["reason"]
    record = run_record(fleet_repo)
    assert [a["reason"] for a in record["attempts"]] == [None, "ci-fix"]
    assert record["run"]["spend_usd"] == pytest.approx(1.2)
    assert not (marks / "prompt-stubborn-3.txt").exists()


def test_fix_ci_without_watch_is_a_usage_error(
    fleet_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    proc = stella_main("fleet", "--fix-ci", "1", "--plan", str(tmp_path / "plan.toml"), cwd=fleet_repo)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "stella: error: --fix-ci needs --watch: it acts on branches whose CI ends red"
    )


def test_stella_watch_fix_ci_sends_a_past_runs_red_branch_back(
    fleet_repo: Path, tmp_path: Path, marks: Path, stella_main: StellaRunner
) -> None:
    (tmp_path / "plan.toml").write_text(PLAN.split("\n\n")[0])  # the fixable task alone
    first = stella_main(
        "fleet", "--watch", "--plan", str(tmp_path / "plan.toml"), "--pipeline", "command", cwd=fleet_repo
    )
    assert first.returncode == 4, first.stdout + first.stderr
    assert not (marks / "prompt-fixable-2.txt").exists()
    proc = stella_main("watch", "--fix-ci", "1", "--json", cwd=fleet_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [watched] = json.loads(proc.stdout)["branches"]
    assert watched["state"] == "green" and watched["fix_rounds"] == 1
    record = run_record(fleet_repo)
    assert [a["reason"] for a in record["attempts"]] == [None, "ci-fix"]
    assert record["attempts"][1]["worktree"] == record["attempts"][0]["worktree"]
    assert ".ci-result says failure at" in (marks / "prompt-fixable-2.txt").read_text()


@pytest.mark.parametrize(
    ("spent", "expected"),
    [
        # the fix-up's guard is what is left of the limit, not the run's per-worker share ($1.00)
        ("0.9", "guard 0.1"),
        # less than the minimum guard ($0.01) left: no fix-up attempt, said in one line
        ("0.995", "no attempt"),
    ],
)
def test_a_past_runs_fix_up_gets_only_what_is_left_of_its_spend_limit(
    fleet_repo: Path, tmp_path: Path, marks: Path, stella_main: StellaRunner, spent: str, expected: str
) -> None:
    (tmp_path / "plan.toml").write_text(PLAN.split("\n\n")[0])  # the fixable task alone
    first = stella_main(
        "--spend-limit", "1", "fleet", "--watch", "--plan", str(tmp_path / "plan.toml"),
        "--pipeline", "command", "--max-concurrency", "1", cwd=fleet_repo, env={"SPEND_EACH": spent},
    )  # fmt: skip
    assert first.returncode == 4, first.stdout + first.stderr
    assert float((marks / "guard-fixable-1.txt").read_text()) == pytest.approx(1.0)
    proc = stella_main("watch", "--fix-ci", "1", "--json", cwd=fleet_repo, env={"SPEND_EACH": "0"})
    assert "Traceback" not in proc.stderr, proc.stderr
    [watched] = json.loads(proc.stdout)["branches"]
    record = run_record(fleet_repo)
    if expected == "no attempt":
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "less than the $0.01 minimum guard left" in watched["reason"], watched
        assert [a["reason"] for a in record["attempts"]] == [None]
        assert not (marks / "guard-fixable-2.txt").exists()
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert float((marks / "guard-fixable-2.txt").read_text()) == pytest.approx(0.1)
        assert [a["reason"] for a in record["attempts"]] == [None, "ci-fix"]


def test_a_fleets_fix_up_with_less_than_the_minimum_guard_left_is_not_started(
    fleet_repo: Path, tmp_path: Path, marks: Path, stella_main: StellaRunner
) -> None:
    (tmp_path / "plan.toml").write_text(PLAN.split("\n\n")[0])  # the fixable task alone
    proc = stella_main(
        "--spend-limit", "1", "fleet", "--json", "--watch", "--fix-ci", "1",
        "--plan", str(tmp_path / "plan.toml"), "--pipeline", "command",
        cwd=fleet_repo, env={"SPEND_EACH": "0.995"},
    )  # fmt: skip
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    [watched] = json.loads(proc.stdout)["watch"]["branches"]
    assert "less than the $0.01 minimum guard left" in watched["reason"], watched
    assert [a["reason"] for a in run_record(fleet_repo)["attempts"]] == [None]
    assert not (marks / "guard-fixable-2.txt").exists()


# Commits through `stella commit`, so the repository's pre-commit hook (which refuses every commit) is
# run or skipped as [commit] hooks says. Every attempt marks what it was told.
HOOKED = """
n = len(list(MARKS.glob(f"hooks-{TASK}-*"))) + 1
mark(f"hooks-{TASK}-{n}", os.environ.get("STELLA_COMMIT_HOOKS", "unset"))
follow_up = "Failing jobs' log" in os.environ["STELLA_PROMPT"]
(WS / "work.txt").write_text("fixed\\n" if follow_up else "broken\\n")
(WS / ".ci-result").write_text("success\\n" if follow_up else "failure\\n")
stella_commit("fix: work.txt says fixed" if follow_up else "work", "work.txt", ".ci-result")
report(spend_usd=0.0, summary="committed")
"""


def test_commit_hooks_skip_reaches_a_past_runs_fix_up_worker(
    fleet_repo: Path, tmp_path: Path, marks: Path, host: GitHubHost, stella: StellaRunner
) -> None:
    hook = fleet_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho refused by the hook >&2\nexit 1\n")
    hook.chmod(0o755)
    config = f'[watch]\npoll_interval = 0.1\nrepo = "{host.repo_flag}"\n\n[commit]\nhooks = "skip"\n'
    write_config(fleet_repo, run=Scripts(tmp_path / "scripts").python("hooked", HOOKED), extra=config)
    (tmp_path / "plan.toml").write_text(PLAN.split("\n\n")[0])  # the fixable task alone
    first = stella(
        "fleet", "--watch", "--plan", str(tmp_path / "plan.toml"), "--pipeline", "command", cwd=fleet_repo
    )
    assert first.returncode == 4, first.stdout + first.stderr
    proc = stella("watch", "--fix-ci", "1", "--json", cwd=fleet_repo)
    assert [(marks / f"hooks-fixable-{n}").read_text() for n in (1, 2)] == ["skip", "skip"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [watched] = json.loads(proc.stdout)["branches"]
    assert watched["state"] == "green" and watched["fix_rounds"] == 1


STACKED_PLAN = """\
[[tasks]]
id = "fixable"
prompt = "make work.txt say fixed"
isolation = "isolated"

[[tasks]]
id = "child"
prompt = "add child.txt on top"
isolation = "isolated"
depends_on = ["fixable"]
base = "parents"

[[tasks]]
id = "clash"
prompt = "rewrite work.txt on top"
isolation = "isolated"
depends_on = ["fixable"]
base = "parents"
"""

# child adds its own file; clash rewrites the file the parent's fix rewrites too. Both pass CI.
ON_TOP = """
name = "child.txt" if TASK == "child" else "work.txt"
(WS / name).write_text(f"{TASK} on top\\n")
(WS / ".ci-result").write_text("success\\n")
subprocess.run(["git", "add", name, ".ci-result"], check=True)
subprocess.run(["git", "commit", "-q", "-m", f"{TASK}: {name}"], check=True)
report(summary=f"{TASK} committed")
"""


def test_a_fix_up_of_a_parent_restacks_its_children_and_leaves_a_conflicting_one_stale(
    fleet_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    config = (fleet_repo / ".stella" / "config.toml").read_text()
    on_top = Scripts(tmp_path / "scripts").python("on-top", ON_TOP)
    tasks = "".join(f'\n[pipelines.command.tasks.{t}]\nrun = "{on_top}"\n' for t in ("child", "clash"))
    (fleet_repo / ".stella" / "config.toml").write_text(config + tasks.replace("\\", "\\\\"))
    (tmp_path / "plan.toml").write_text(STACKED_PLAN)
    plan = str(tmp_path / "plan.toml")

    proc = stella_main(
        "fleet", "--json", "--watch", "--fix-ci", "1", "--plan", plan, "--pipeline", "command", cwd=fleet_repo
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(fleet_repo)
    tasks = {task["id"]: task for task in record["tasks"]}
    fixed = git("rev-parse", tasks["fixable"]["branch"], cwd=fleet_repo).strip()
    child = tasks["child"]["branch"]
    assert git("log", "-1", "--format=%s", fixed, cwd=fleet_repo).strip() == "fix: work.txt says fixed"
    # child: replayed onto the fixed parent, its own file kept, no longer stale
    assert git("merge-base", "--is-ancestor", fixed, child, cwd=fleet_repo) == ""
    assert git("show", f"{child}:child.txt", cwd=fleet_repo) == "child on top\n"
    assert tasks["child"]["stale"] is None
    assert Path(tasks["child"]["worktree"], "work.txt").read_text() == "fixed\n"  # its checkout followed
    # clash: its work.txt conflicts with the fix: named, stale, its branch as it was
    assert tasks["clash"]["stale"] == "fixable changed after it started"
    assert git("show", f"{tasks['clash']['branch']}:work.txt", cwd=fleet_repo) == "clash on top\n"
    doc = json.loads(proc.stdout)
    watched = {b["task_id"]: b for b in doc["watch"]["branches"]}
    assert (
        watched["clash"]["stale"] == "fixable changed after it started" and watched["child"]["stale"] is None
    )
    assert "restacked child onto fixable's new work" in proc.stdout + proc.stderr
    assert "clash is stale (fixable changed after it started) and its branch is left as it was" in (
        proc.stdout + proc.stderr
    )
    assert "stale: fixable changed after it started" in stella_main("runs", "latest", cwd=fleet_repo).stdout
    # both waited on a person from before either moved; what no replay could settle still does (clash)
    stale = [r for r in record["requests"] if r["reason"] == "stale"]
    waiting = [r for r in stale if r["state"] == "needs_you"]
    assert [(r["task_id"], r["asked_by"], r["branch"]) for r in waiting] == [
        ("clash", "restack", tasks["clash"]["branch"])
    ]
    assert "its own work would conflict with the new start on work.txt" in waiting[0]["context"]
    assert [(r["state"], r["why"]) for r in stale if r["task_id"] == "child"] == [("dismissed", "restacked")]
