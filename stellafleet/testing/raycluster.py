"""A real 2-node Ray cluster on this machine, inside a private network namespace with only loopback.

`unshare --net sleep infinity` holds a network namespace of its own; `ray start --head` (node_a) and
`ray start --address` (node_b) run inside it through `nsenter`, so no Ray process can reach any address but
127.0.0.1 and no port collides with anything outside. Teardown kills exactly the processes started here
(and their descendants) by pid: never `ray stop`, which stops every Ray process of the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

PORT = 6379  # free by construction: the namespace is ours
ADDRESS = f"127.0.0.1:{PORT}"
BIN = Path(sys.executable).parent


def unavailable() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -e '.[ray]')"
    if not (BIN / "ray").exists():
        return f"no ray command beside {sys.executable}"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux, iproute2)"
    if os.geteuid() != 0:
        return "a private network namespace needs root (unshare --net)"
    return None


def quiet_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment for Ray processes: no usage stats, nothing phoning home."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}
    env["RAY_raylet_start_wait_time_s"] = "180"  # a busy machine registers a node slowly: wait, not fail
    env.pop("RAY_ADDRESS", None)
    return {**env, **(extra or {})}


class Cluster:
    """The namespace holder and the two nodes; everything by pid."""

    def __init__(self) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="sfray-"))  # short: Ray's socket paths must fit
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], start_new_session=True)
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self._known: dict[int, psutil.Process] = {}

    def ns(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", *argv]

    def _wait_for_namespace(self, timeout: float = 30.0) -> None:
        """Until unshare has made the holder's namespace: before that, nsenter would enter ours."""
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.holder.pid}/ns/net") != ours:
                    return
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("unshare --net did not make a network namespace")
            time.sleep(0.02)

    def start(self, slots: int = 2, timeout: float = 240.0) -> None:
        self._wait_for_namespace()
        subprocess.run(self.ns(["ip", "link", "set", "lo", "up"]), check=True)
        self._node("node_a", ["--head", "--port", str(PORT), "--include-dashboard=false"], slots)
        self._wait_started("node_a", timeout)
        self._node("node_b", ["--address", ADDRESS], slots)
        self._wait_started("node_b", timeout)
        self._wait_for({"node_a", "node_b"}, timeout)

    def _wait_started(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log(name):
            if self.nodes[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start for {name} did not start: {self.log(name)[-2000:]}")
            time.sleep(0.2)

    def restart_node_b(self, slots: int = 2, timeout: float = 240.0) -> None:
        """Start node_b again after a test killed part of it (its old processes are killed first)."""
        old = self.nodes["node_b"]
        self._kill_tree(old)
        (self.temp / "node_b.log").write_text("")
        self._node("node_b", ["--address", ADDRESS], slots)
        self._wait_started("node_b", timeout)
        self._wait_for({"node_a", "node_b"}, timeout)

    def _kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def _node(self, name: str, role: list[str], slots: int) -> None:
        resources = json.dumps({name: 1, "stella_slot": slots})
        # --num-cpus = slots, as docs/scale-out.md says to start a node: Ray keeps that many idle workers
        # warm, and kills any beyond it after a second idle (the next attempt then waits for a new one)
        argv = [
            str(BIN / "ray"), "start", *role, "--node-ip-address", "127.0.0.1", "--num-cpus", str(slots),
            "--object-store-memory", "100000000", "--resources", resources, "--temp-dir", str(self.temp),
            "--disable-usage-stats", "--block",
        ]  # fmt: skip
        log = (self.temp / f"{name}.log").open("ab")
        # each node keeps its clones of a run's base apart, as on a machine of its own (git/nodeclone.py)
        cache = str(self.temp / f"{name}-clones")
        env = quiet_env({"STELLA_NODE_NAME": name.replace("_", "-"), "STELLA_NODE_CACHE": cache})
        self.nodes[name] = subprocess.Popen(
            self.ns(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()

    def _wait_for(self, names: set[str], timeout: float) -> None:
        probe = f"import ray, json; ray.init(address={ADDRESS!r}); print(json.dumps(ray.cluster_resources()))"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, node in self.nodes.items():
                if node.poll() is not None:
                    raise RuntimeError(f"ray start for {name} exited: {self.log(name)[-2000:]}")
            argv = self.ns([sys.executable, "-c", probe])
            done = subprocess.run(argv, capture_output=True, text=True, env=quiet_env(), timeout=60)
            if done.returncode == 0 and names <= set(json.loads(done.stdout.strip().splitlines()[-1])):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray nodes {sorted(names)} did not come up within {timeout:g}s")

    def log(self, name: str) -> str:
        return (self.temp / f"{name}.log").read_text(errors="replace")

    def raylet_pid(self, name: str) -> int:
        """The pid of a node's raylet (a child of its `ray start --block`)."""
        for child in psutil.Process(self.nodes[name].pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name() == "raylet":
                    return child.pid
        raise AssertionError(f"no raylet under {name}")

    def remember(self) -> None:
        """Note every descendant of our processes now, so teardown kills them by pid even once orphaned."""
        for proc in (self.holder, *self.nodes.values()):
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    self._known[child.pid] = child

    def stop(self) -> None:
        self.remember()
        for proc in (*self.nodes.values(), self.holder):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # each was started in a session (group) of its own
        for child in self._known.values():
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        for proc in (*self.nodes.values(), self.holder):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)
