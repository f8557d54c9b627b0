"""`stella fleet --land --fix 1`: a plan of 12 isolated tasks run, then landed by the merge train in fewer
check runs than branches; the pair red only together split with the later one evicted and named; the task
whose branch conflicts with landed work fixed by its own worker from the eviction's context, and landed."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner, git

# the queue's order: batch 1 takes 8 disjoint branches (o2 overlaps o1 in shared.md: it waits)
ORDER = ("t1", "a1", "a2", "r1", "o1", "a3", "o2", "a4", "r2", "a5", "a6", "cfl")
PLAN = "".join(f'[[tasks]]\nid = "{t}"\nprompt = "do {t}"\nisolation = "isolated"\n\n' for t in ORDER)

WORKER = """\
prompt = os.environ.get("STELLA_PROMPT", "")
def commit(message):
    subprocess.run(["git", "add", "-A"], cwd=WS, check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=WS, check=True)
if "conflicts with work already landed" in prompt:  # its eviction, from the merge train: both sides kept
    (WS / "config.txt").write_text("t1 and cfl\\n")
    commit("cfl: keep t1's setting too")
elif "its checks failed there" in prompt:
    sys.exit("r2 cannot work together with r1")
elif TASK in ("t1", "cfl"):
    (WS / "config.txt").write_text(f"{TASK}\\n")
    commit(f"{TASK}: config")
elif TASK in ("o1", "o2"):
    lines = (WS / "shared.md").read_text().splitlines()
    lines[0 if TASK == "o1" else -1] = f"{TASK} was here"
    (WS / "shared.md").write_text("\\n".join(lines) + "\\n")
    commit(f"{TASK}: shared.md")
else:
    (WS / f"{TASK}.{'flag' if TASK.startswith('r') else 'txt'}").write_text(f"{TASK}\\n")
    commit(f"{TASK}: its file")
report(summary="done")
"""

# red only with both flags; each run leaves a line in $CHECK_LOG
CHECK = 'echo run >> "$CHECK_LOG"; ! { test -e r1.flag && test -e r2.flag; }'


def test_fleet_land_lands_the_run_in_fewer_checks_than_branches_and_fixes_the_conflicting_task(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "config.txt").write_text("base\n")
    (git_repo / "shared.md").write_text("".join(f"line {n}\n" for n in range(20)))
    git("add", ".", cwd=git_repo)
    git("commit", "-qm", "base files", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    worker = Scripts(tmp_path / "scripts").python("worker", WORKER)
    write_config(git_repo, run=worker, extra=f"[merge]\ncheck = '{CHECK}'\n")  # a TOML literal string
    log = tmp_path / "checks.log"
    args = ("fleet", "--plan", str(plan), "--pipeline", "command", "--land", "--fix", "1")
    done = stella(*args, cwd=git_repo, env={"CHECK_LOG": str(log)}, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # r2 did not land: not everything did
    landed = [t for t in ORDER if t != "r2"]
    record = run_record(git_repo)
    merged = {row["task_id"] for row in record["merges"] if row["status"] == "merged"}
    assert merged == set(landed), out
    assert len(log.read_text().splitlines()) < len(ORDER)  # fewer check runs than branches
    # the pair red together: the later one evicted, by name
    assert "batch 1: bisect: checking the first 4 of 8" in out, out
    assert "evicted: fleet/r2-" in out and "[r2]: check `" in out, out
    assert "land: 11 of 12 branch(es) landed on main" in out and "waiting on you: 1 eviction" in out
    # cfl was evicted for its conflict with t1, fixed by its own worker, and landed after
    assert (git_repo / "config.txt").read_text() == "t1 and cfl\n"
    requests = [r for r in record["requests"] if r["reason"] == "evicted"]
    cfl = [r for r in requests if r["task_id"] == "cfl"]
    assert cfl and cfl[0]["state"] == "served" and "config.txt" in cfl[0]["context"]
    assert "t1: config" in cfl[0]["context"]  # the landed commit it conflicts with
    assert [r["state"] for r in requests if r["task_id"] == "r2"][-1] == "needs_you"
    attempts = [a for a in record["attempts"] if a["task_id"] == "cfl"]
    assert len(attempts) == 2 and by_id(record["tasks"])["cfl"]["status"] == "succeeded"
    for name in ("a1.txt", "a6.txt", "r1.flag"):
        assert (git_repo / name).exists()
    assert not (git_repo / "r2.flag").exists()
    shared = (git_repo / "shared.md").read_text().splitlines()
    assert shared[0] == "o1 was here" and shared[-1] == "o2 was here"
