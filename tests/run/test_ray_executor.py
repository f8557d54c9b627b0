"""`stella fleet --executor ray` against a real 2-node Ray cluster on this machine.

The cluster (helpers/raycluster.py) runs in a private network namespace with only loopback; the fleet
runs inside it too. Workers are command-pipeline scripts that synchronise with the test through files
(the nodes share this machine's file system, not the fleet's environment).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers.fleet import by_id, run_record, toml_str, wait_for
from helpers.needs import missing
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.testing import raycluster

PLAN = """\
[[tasks]]
id = "t1"
prompt = "first"
isolation = "isolated"

[[tasks]]
id = "t2"
prompt = "after t1, on node_b"
isolation = "isolated"
depends_on = ["t1"]

[[tasks]]
id = "t3"
prompt = "fails"
isolation = "isolated"

[[tasks]]
id = "t4"
prompt = "after t3"
isolation = "isolated"
depends_on = ["t3"]

[[tasks]]
id = "s1"
prompt = "in the shared tree: stays on this machine"
claims = ["shared.txt"]
"""

WORK = (
    'echo "work of $STELLA_TASK_ID" > "$STELLA_TASK_ID.txt" && '
    'stella commit -m "work $STELLA_TASK_ID" "$STELLA_TASK_ID.txt" && '
    'echo \'{"spend_usd": 0.25, "input_tokens": 10, "summary": "did it"}\' > "$STELLA_COMMAND_RESULT"'
)

SHARED = (
    'echo "$STELLA_RUN_ID" > shared.txt && stella commit -m "work $STELLA_TASK_ID" shared.txt && '
    'echo \'{"spend_usd": 0.25, "input_tokens": 10, "summary": "did it"}\' > "$STELLA_COMMAND_RESULT"'
)

# Marks its start (with its pid), then waits for a release file ("go" for all, "go-TASK" for one) that never
# comes unless the test says so.
BLOCK = """\
import os, sys, time
from pathlib import Path
marks = Path({marks!r})
task = os.environ["STELLA_TASK_ID"]
(marks / (task + ".tmp")).write_text(str(os.getpid()))
(marks / (task + ".tmp")).rename(marks / (task + ".pid"))
deadline = time.monotonic() + 120
while not (marks / "go").exists() and not (marks / ("go-" + task)).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


# One cluster per module: keep every test of this file on one xdist worker (run with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray-cluster")


@pytest.fixture(autouse=True)
def _grouped(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("loadgroup", False):  # an xdist worker under --dist loadgroup
        # pytest 9 with pytest-xdist 3.8 dropped the group without a word, and each worker started a cluster
        assert request.node.nodeid.endswith("@ray-cluster"), f"not grouped: {request.node.nodeid}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[raycluster.Cluster]:
    why = raycluster.unavailable()
    if why is not None:
        missing(why)
    started = raycluster.Cluster()
    try:
        started.start()
        yield started
    finally:
        started.stop()


def make_repo(root: Path, config: str) -> Path:
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    git("config", "user.name", "Test User", cwd=root)
    git("config", "user.email", "test@example.invalid", cwd=root)
    (root / "README.md").write_text("# test repository\n")
    git("add", "README.md", cwd=root)
    git("commit", "-q", "-m", "initial commit", cwd=root)
    StatePaths(root).config_file.parent.mkdir(parents=True)
    StatePaths(root).config_file.write_text(config)
    (root.parent / "plan.toml").write_text(PLAN)
    return root


def fleet_argv(cluster: raycluster.Cluster, *extra: str, executor: str = "ray") -> list[str]:
    argv = [sys.executable, "-m", "stellafleet", "fleet", "--plan", "../plan.toml", "--pipeline", "command"]
    argv += ["--max-concurrency", "2", *extra]
    if executor == "ray":
        argv += ["--executor", "ray", "--ray-address", raycluster.ADDRESS]
    return cluster.ns(argv)


def fleet_env(home: Path) -> dict[str, str]:
    env = raycluster.quiet_env({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {key: value for key, value in env.items() if not key.startswith("STELLA_")}


def run_fleet(
    cluster: raycluster.Cluster, root: Path, *, executor: str = "ray"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        fleet_argv(cluster, executor=executor),
        cwd=root,
        env=fleet_env(root.parent),
        capture_output=True,
        text=True,
        timeout=400,
    )


def summary(record: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """What a run did per task, as comparable between executors: status, commit messages, spend, tokens."""
    attempts = by_id(record["attempts"], "task_id")
    messages: dict[str, list[str]] = {}
    for commit in record["commits"]:
        messages.setdefault(commit["task_id"], []).append(commit["message"])
    out = {}
    for task in record["tasks"]:
        attempt = attempts.get(task["id"], {})
        out[task["id"]] = (
            task["status"],
            tuple(messages.get(task["id"], [])),
            attempt.get("spend_usd"),
            attempt.get("input_tokens"),
        )
    return out


def test_a_plan_runs_on_the_cluster_as_it_runs_locally(cluster: raycluster.Cluster, tmp_path: Path) -> None:
    config = f"[pipelines.command]\nrun = {toml_str(WORK)}\n\n[pipelines.command.tasks.t3]\nrun = 'exit 3'\n"
    config += f"\n[pipelines.command.tasks.s1]\nrun = {toml_str(SHARED)}\n"
    config += "\n[executor.tasks.t2]\nresources = {node_b = 1}\n"
    root = make_repo(tmp_path / "repo", config)

    remote = run_fleet(cluster, root)
    assert remote.returncode == 1, remote.stdout + remote.stderr
    ray_run = run_record(root)
    local = run_fleet(cluster, root, executor="local")
    assert local.returncode == 1, local.stdout + local.stderr
    local_run = run_record(root)
    assert local_run["run"]["id"] != ray_run["run"]["id"]

    assert summary(ray_run) == summary(local_run)
    tasks = by_id(ray_run["tasks"])
    statuses = [tasks[t]["status"] for t in ("t1", "t2", "t3", "t4", "s1")]
    assert statuses == ["succeeded", "succeeded", "failed", "skipped", "succeeded"]
    assert "dependency failed: t3" in tasks["t4"]["reason"]
    assert ray_run["run"]["executor"] == "ray" and local_run["run"]["executor"] is None
    assert ray_run["run"]["spend_usd"] == pytest.approx(0.75)
    attempts = by_id(ray_run["attempts"], "task_id")
    # the shared task ran here, in the shared tree, as a local worker: no node, a local pid
    assert attempts["s1"]["node"] is None and attempts["s1"]["pid"] is not None
    assert git("log", "-1", "--format=%s", "main", cwd=root) == "work s1\n"
    assert attempts["t2"]["node"] == "node-b"  # pinned by [executor.tasks.t2]
    assert {attempts[t]["node"] for t in ("t1", "t3")} <= {"node-a", "node-b"}
    assert all(attempts[t]["worktree"] is None for t in ("t1", "t2", "t3"))
    # the branches came back as git objects: in the head repository, with the commits the ledger names
    for commit in (c for c in ray_run["commits"] if c["task_id"] != "s1"):
        assert git("log", "-1", "--format=%H %s", commit["branch"], cwd=root).split(" ", 1) == [
            commit["sha"],
            f"work {commit['task_id']}\n",
        ]
        assert (
            git("show", f"{commit['sha']}:{commit['task_id']}.txt", cwd=root)
        ) == f"work of {commit['task_id']}\n"
    assert not (StatePaths(root).worktrees / tasks["t1"]["branch"].removeprefix("fleet/")).exists()
    with sqlite3.connect(StatePaths(root).fleet_db) as conn:
        seqs = conn.execute(
            "SELECT seq FROM spend_events WHERE attempt_id = ?", (attempts["t1"]["id"],)
        ).fetchall()
    assert seqs == [(1,)]
    log = Path(attempts["t1"]["log_path"]).read_text()
    assert "stella worker: succeeded: did it" in log


def start_blocking_fleet(
    cluster: raycluster.Cluster, tmp_path: Path, plan: str, config_extra: str = ""
) -> tuple[Path, Path, subprocess.Popen[str]]:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "block.py"
    script.write_text(BLOCK.format(marks=str(marks)))
    config = f"[pipelines.command]\nrun = {toml_str(f'{sys.executable} {script}')}\n" + config_extra
    root = make_repo(tmp_path / "repo", config)
    (tmp_path / "plan.toml").write_text(plan)
    proc = subprocess.Popen(
        fleet_argv(cluster, "--json"),
        cwd=root,
        env=fleet_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return root, marks, proc


TWO_BLOCKING = """\
[[tasks]]
id = "a"
prompt = "blocks"
isolation = "isolated"

[[tasks]]
id = "b"
prompt = "blocks too"
isolation = "isolated"
"""


def test_ctrl_c_cancels_the_remote_tasks_and_exits_130(cluster: raycluster.Cluster, tmp_path: Path) -> None:
    root, marks, proc = start_blocking_fleet(cluster, tmp_path, TWO_BLOCKING)
    try:
        wait_for(marks / "a.pid", timeout=120)
        wait_for(marks / "b.pid", timeout=120)
        workers = [int((marks / f"{t}.pid").read_text()) for t in ("a", "b")]
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # the second Ctrl-C stops the running workers
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    record = run_record(root)
    assert {a["outcome"] for a in record["attempts"]} == {"interrupted"}
    assert record["run"]["status"] == "interrupted"
    deadline = time.monotonic() + 30  # the node-side reaper ends each worker once its Ray worker is gone
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in workers):
        assert time.monotonic() < deadline, f"remote workers outlived the cancel: {describe(workers)}"
        time.sleep(0.2)


def describe(pids: list[int]) -> str:
    """Each pid's ancestry, and every reaper running: what a failure needs to be understood."""
    lines = []
    for pid in pids:
        try:
            chain = [psutil.Process(pid), *psutil.Process(pid).parents()]
            lines.append(" <- ".join(f"{p.pid} {' '.join(p.cmdline())[:60]}" for p in chain[:5]))
        except psutil.Error as exc:
            lines.append(f"{pid}: {exc}")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "stellafleet.proc.reaper" in " ".join(proc.info["cmdline"] or []):
            lines.append(f"reaper {proc.info['pid']}: {' '.join(proc.info['cmdline'])}")
    return "\n".join(lines)


NO_CLI = """\
[[tasks]]
id = "agent"
prompt = "needs the codex CLI, which node_b does not have"
isolation = "isolated"
pipeline = "codex"
"""


def test_a_node_without_the_pipelines_cli_fails_that_tasks_preflight(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    tools = tmp_path / "head-only-bin"  # on the fleet's PATH, not on the nodes'
    tools.mkdir()
    (tools / "codex-for-test").write_text("#!/bin/sh\nexit 0\n")
    (tools / "codex-for-test").chmod(0o755)
    config = '[pipelines.codex]\nbinary = "codex-for-test"\n'
    config += "\n[executor.tasks.agent]\nresources = {node_b = 1}\n"
    root = make_repo(tmp_path / "repo", config)
    (tmp_path / "plan.toml").write_text(NO_CLI)
    env = fleet_env(tmp_path)
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    done = subprocess.run(fleet_argv(cluster), cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    task = by_id(run_record(root)["tasks"])["agent"]
    assert task["status"] == "failed"
    assert task["reason"].startswith("preflight on node node-b: pipeline codex:"), task["reason"]
    assert "'codex-for-test' not found on PATH" in task["reason"]


PINNED = """\
[[tasks]]
id = "lost"
prompt = "on node_b, whose raylet dies"
isolation = "isolated"

[[tasks]]
id = "after"
prompt = "depends on the lost one"
isolation = "isolated"
depends_on = ["lost"]

[[tasks]]
id = "fine"
prompt = "on node_a"
isolation = "isolated"
"""


def test_a_lost_node_fails_its_attempt_and_the_rest_finish(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    extra = (
        "\n[executor.tasks.lost]\nresources = {node_b = 1}\n[executor.tasks.fine]\nresources = {node_a = 1}\n"
    )
    root, marks, proc = start_blocking_fleet(cluster, tmp_path, PINNED, extra)
    try:
        wait_for(marks / "lost.pid", timeout=120)
        wait_for(marks / "fine.pid", timeout=120)
        cluster.remember()
        os.kill(cluster.raylet_pid("node_b"), signal.SIGKILL)
        time.sleep(1.0)
        (marks / "go-fine").write_text("")  # node_a's task may finish; the lost one ends with its node
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.restart_node_b()
    assert proc.returncode == 1, out + err
    doc = json.loads(out)
    assert doc["status"] == "failed"
    record = run_record(root)
    tasks, attempts = by_id(record["tasks"]), by_id(record["attempts"], "task_id")
    assert tasks["fine"]["status"] == "succeeded" and attempts["fine"]["node"] == "node-a"
    assert tasks["lost"]["status"] == "failed" and attempts["lost"]["node"] == "node-b"
    assert "the worker on node node-b was lost" in tasks["lost"]["reason"]
    assert tasks["after"]["status"] == "skipped" and "dependency failed: lost" in tasks["after"]["reason"]
    assert git("rev-parse", tasks["lost"]["branch"], cwd=root).strip() == record["run"]["base_commit"]


# The scripted model server inside the namespace (the nodes reach only its loopback); when the stop file
# appears it writes the model each request named, in order, and exits.
SERVE_MODEL = """\
import json, sys, time
from pathlib import Path
from stellafleet.testing.model_server import ScriptedModelServer, load_script
with ScriptedModelServer(load_script(Path(sys.argv[1])), port=int(sys.argv[2])) as server:
    Path(sys.argv[3] + ".ready").write_text("")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    Path(sys.argv[4]).write_text(json.dumps([request.body["model"] for request in server.requests]))
"""
MODEL_PORT = 18081  # free by construction: the namespace is ours


def engine_session(name: str) -> list[dict[str, Any]]:
    usage = {"input_tokens": 100, "output_tokens": 10}
    write = {"name": "write_file", "arguments": {"path": f"{name}.txt", "content": f"{name}\n"}}
    return [
        {"tool_calls": [write], "usage": usage},
        {"tool_calls": [{"name": "commit", "arguments": {"message": f"Add {name}.txt"}}], "usage": usage},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": f"added {name}"}}], "usage": usage},
    ]


@pytest.mark.parametrize("source", ["env", "file", "both"])
def test_the_engine_configured_by_environment_or_file_runs_on_the_cluster(
    cluster: raycluster.Cluster, tmp_path: Path, source: str
) -> None:
    base_url = f"http://127.0.0.1:{MODEL_PORT}/v1"
    config = ""
    if source != "env":  # "both": the file's dead URL loses to the environment's
        url = "http://127.0.0.1:9/v1" if source == "both" else base_url
        config = f'[engine]\nprovider = "openai"\nmodel = "file-model"\nbase_url = "{url}"\nmax_retries = 0\n'
    root = make_repo(tmp_path / "repo", config)
    (tmp_path / "plan.toml").write_text(
        '[[tasks]]\nid = "own"\nprompt = "Write alpha.txt"\nmodel = "task-model"\nisolation = "isolated"\n\n'
        '[[tasks]]\nid = "configured"\nprompt = "Write beta.txt"\nisolation = "isolated"\n'
        'depends_on = ["own"]\n'
    )
    (tmp_path / "script.json").write_text(json.dumps(engine_session("alpha") + engine_session("beta")))
    (tmp_path / "serve.py").write_text(SERVE_MODEL)
    stop, models = tmp_path / "stop", tmp_path / "models.json"
    serve = [sys.executable, str(tmp_path / "serve.py"), str(tmp_path / "script.json"), str(MODEL_PORT)]
    server = subprocess.Popen(cluster.ns([*serve, str(stop), str(models)]), env=raycluster.quiet_env())
    env = fleet_env(tmp_path) | {"OPENAI_API_KEY": "sk-test-not-real"}
    if source != "file":
        env |= {"STELLA_PROVIDER": "openai", "STELLA_MODEL": "env-model", "STELLA_BASE_URL": base_url}
    try:
        wait_for(Path(f"{stop}.ready"), timeout=60)
        argv = [sys.executable, "-m", "stellafleet", "fleet", "--plan", "../plan.toml"]
        argv += ["--max-concurrency", "2", "--executor", "ray", "--ray-address", raycluster.ADDRESS]
        ns_argv = cluster.ns(argv)
        fleet = subprocess.run(ns_argv, cwd=root, env=env, capture_output=True, text=True, timeout=400)
        stop.write_text("")
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert fleet.returncode == 0, fleet.stdout + fleet.stderr
    configured = "file-model" if source == "file" else "env-model"
    assert json.loads(models.read_text()) == ["task-model"] * 3 + [configured] * 3
    attempts = by_id(run_record(root)["attempts"], "task_id")
    assert {attempts[t]["node"] for t in ("own", "configured")} <= {"node-a", "node-b"}


def test_nodes_keep_one_clone_of_the_base_and_run_the_setup_in_each_tasks_checkout(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    setup = 'echo "setup of $STELLA_TASK_ID on $STELLA_NODE_NAME, index $STELLA_WORKTREE_INDEX"'
    config = f"[pipelines.command]\nrun = {toml_str(WORK)}\n\n[worktree]\nsetup = {toml_str(setup)}\n"
    root = make_repo(tmp_path / "repo", config)
    plan = "".join(f'[[tasks]]\nid = "n{n}"\nprompt = "p"\nisolation = "isolated"\n\n' for n in range(4))
    (root.parent / "plan.toml").write_text(plan)

    ran = run_fleet(cluster, root)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = run_record(root)
    base = record["run"]["base_commit"]
    for attempt in record["attempts"]:
        assert attempt["setup_ms"] is not None
        log = Path(attempt["log_path"]).read_text()
        assert f"setup of {attempt['task_id']} on {attempt['node']}, index " in log, log
        assert git("show", f"{attempt['branch']}:{attempt['task_id']}.txt", cwd=root) == (
            f"work of {attempt['task_id']}\n"
        )
    for node in ("node_a", "node_b"):
        cache = cluster.temp / f"{node}-clones"
        clones = [path.name for path in cache.iterdir() if path.is_dir()] if cache.exists() else []
        # one clone per base commit (this run's, and the other tests' runs'), never one per attempt
        assert all(len(name) == 40 for name in clones), clones
        if base in clones:  # each attempt's worktree and branch are gone from it once the attempt ended
            listed = git("worktree", "list", "--porcelain", cwd=cache / base)
            assert listed.count("worktree ") == 1, listed
            assert git("branch", "--list", "fleet/*", cwd=cache / base) == ""
    assert any((cluster.temp / f"{node}-clones" / base).exists() for node in ("node_a", "node_b"))


# Commits one file, writes another and edits README.md, then hangs past its task's timeout.
COMMIT_WRITE_HANG = (
    'echo one > one.txt && stella commit -m "one" one.txt && echo "half way" > half.txt && '
    'echo "edited on the node" > README.md && sleep 120'
)


def test_a_timed_out_remote_task_leaves_its_uncommitted_work_on_a_salvage_ref(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    config = f"[pipelines.command]\nrun = {toml_str(COMMIT_WRITE_HANG)}\n\n[fleet]\nstop_grace = 1\n"
    root = make_repo(tmp_path / "repo", config)
    # timeout 10 s: room for the worker to start and write on a busy machine before it is stopped
    (root.parent / "plan.toml").write_text(
        '[[tasks]]\nid = "slow"\nprompt = "p"\nisolation = "isolated"\ntimeout = 10\n'
    )

    ran = run_fleet(cluster, root)

    assert ran.returncode == 1, ran.stdout + ran.stderr
    record = run_record(root)
    [attempt] = record["attempts"]
    assert attempt["node"] in {"node-a", "node-b"} and "timed out after 10s" in attempt["error"]
    assert attempt["salvage_ref"] == f"refs/stella/salvage/{record['run']['id']}/slow/{attempt['id']}"
    sha = attempt["salvage_sha"]
    assert git("rev-parse", attempt["salvage_ref"], cwd=root).strip() == sha
    # on top of the task's branch as it came home (its one commit), holding exactly what was uncommitted
    assert git("rev-parse", f"{sha}^", cwd=root) == git("rev-parse", attempt["branch"], cwd=root)
    assert git("log", "-1", "--format=%s", attempt["branch"], cwd=root) == "one\n"
    names = git("diff-tree", "-r", "--no-commit-id", "--name-only", f"{sha}^", sha, cwd=root).split()
    assert sorted(names) == ["README.md", "half.txt"]
    assert git("show", f"{sha}:half.txt", cwd=root) == "half way\n"
    # the node's kept clone holds no salvage ref of it: the ref lives where it came home
    for node in ("node_a", "node_b"):
        clone = cluster.temp / f"{node}-clones" / record["run"]["base_commit"]
        if clone.exists():
            assert git("for-each-ref", "refs/stella/", cwd=clone) == ""

    # --from-salvage: the resumed task's checkout on the node starts from that commit, as a local one does
    look = 'cp half.txt seen.txt && stella commit -m "seen" seen.txt && '
    look += 'echo \'{"summary": "continued"}\' > "$STELLA_COMMAND_RESULT"'
    StatePaths(root).config_file.write_text(f"[pipelines.command]\nrun = {toml_str(look)}\n")
    argv = [sys.executable, "-m", "stellafleet", "fleet", "--resume", record["run"]["id"], "--from-salvage"]
    argv += ["--pipeline", "command", "--executor", "ray", "--ray-address", raycluster.ADDRESS]
    resumed = subprocess.run(
        cluster.ns(argv), cwd=root, env=fleet_env(root.parent), capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [again] = run_record(root)["attempts"]
    assert again["node"] in {"node-a", "node-b"}
    assert git("show", f"{again['branch']}:seen.txt", cwd=root) == "half way\n"
    # the salvaged work is folded into the task's next commit, on the salvage commit's parent
    # (the worker committed only seen.txt; the rest of the staged work is committed as it is left)
    on_branch = git("log", "--format=%s", f"{sha}^..{again['branch']}", cwd=root).splitlines()
    assert on_branch == ["p (command, uncommitted changes)", "seen"]
    assert git("show", f"{again['branch']}:half.txt", cwd=root) == "half way\n"


INCLUDE_TASK = (
    '{ cat .env 2>/dev/null || echo "no .env"; } > seen.txt && stella commit -m seen seen.txt && '
    'echo \'{"summary": "looked"}\' > "$STELLA_COMMAND_RESULT"'
)
INCLUDE_SETUP = 'if [ -f .env ]; then echo "setup saw .env"; else echo "setup saw no .env"; fi'


def test_worktreeinclude_files_travel_to_the_node_only_when_asked(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    common = f"[pipelines.command]\nrun = {toml_str(INCLUDE_TASK)}\n\n"
    common += f"[worktree]\nsetup = {toml_str(INCLUDE_SETUP)}\n"
    root = make_repo(tmp_path / "repo", common)
    (root / ".gitignore").write_text(".env\n")
    (root / ".worktreeinclude").write_text(".env\n")
    git("add", ".gitignore", ".worktreeinclude", cwd=root)
    git("commit", "-q", "-m", "ignores", cwd=root)
    (root / ".env").write_text("API_TOKEN=from-the-head\n")
    (root.parent / "plan.toml").write_text('[[tasks]]\nid = "inc"\nprompt = "p"\nisolation = "isolated"\n')
    config = StatePaths(root).config_file

    def attempt_of_run(extra: str) -> tuple[dict[str, Any], str]:
        config.write_text(common + extra)
        ran = run_fleet(cluster, root)
        [attempt] = run_record(root)["attempts"]
        return attempt, ran.stdout + ran.stderr

    off, out = attempt_of_run("")  # the default: nothing of .worktreeinclude leaves this machine
    assert off["outcome"] == "succeeded", out
    assert git("show", f"{off['branch']}:seen.txt", cwd=root) == "no .env\n"
    assert "setup saw no .env" in Path(off["log_path"]).read_text()

    on, out = attempt_of_run("\n[executor]\nsend_worktreeinclude = true\n")
    assert on["outcome"] == "succeeded", out
    assert on["node"] in {"node-a", "node-b"}
    assert git("show", f"{on['branch']}:seen.txt", cwd=root) == "API_TOKEN=from-the-head\n"
    log = Path(on["log_path"]).read_text()
    assert "[stella] .worktreeinclude: copied 1 files (0.0 MB)" in log and "setup saw .env" in log, log

    # the local limit holds for a node too: refused by name, before anything is sent or any worker starts
    over, out = attempt_of_run("include_max_mb = 0.00001\n\n[executor]\nsend_worktreeinclude = true\n")
    assert over["outcome"] == "failed", out
    assert over["error"] == (
        "setup failed: .worktreeinclude: .env (24 bytes) over [worktree] include_max_mb = 1e-05: "
        "raise include_max_mb, or leave the file out of .worktreeinclude"
    )
    assert over["node"] is None
    assert git("rev-parse", over["branch"], cwd=root).strip() == git("rev-parse", "main", cwd=root).strip()


STACKED = """\
[defaults]
isolation = "isolated"

[[tasks]]
id = "a"
prompt = "the a file"

[[tasks]]
id = "b"
prompt = "the b file"

[[tasks]]
id = "c"
prompt = "on both"
depends_on = ["a", "b"]
base = "parents"
"""

LOOK_AROUND = (
    # one simple command: its glob is expanded before seen.txt is made (`ls *.txt | tr ... >` raced it)
    'echo *.txt > seen.txt && stella commit -m "seen" seen.txt && '
    'echo \'{"summary": "looked"}\' > "$STELLA_COMMAND_RESULT"'
)


def test_a_stacked_tasks_start_commit_travels_to_its_node_in_the_attempts_bundle(
    cluster: raycluster.Cluster, tmp_path: Path
) -> None:
    config = f"[pipelines.command]\nrun = {toml_str(WORK)}\n"
    config += f"\n[pipelines.command.tasks.c]\nrun = {toml_str(LOOK_AROUND)}\n"
    root = make_repo(tmp_path / "repo", config)
    (root.parent / "plan.toml").write_text(STACKED)

    ran = run_fleet(cluster, root)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = run_record(root)
    attempt = by_id(record["attempts"], "task_id")["c"]
    assert attempt["node"] in {"node-a", "node-b"} and attempt["start_commit"]
    assert git("show", f"{attempt['branch']}:seen.txt", cwd=root) == "a.txt b.txt\n"
    assert git("rev-parse", f"{attempt['branch']}~1", cwd=root).strip() == attempt["start_commit"]
    assert [c["message"] for c in record["commits"] if c["task_id"] == "c"] == ["seen"]
