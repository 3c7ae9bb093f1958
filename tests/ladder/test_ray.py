"""nfladder --executor ray on a real multi-node Ray cluster inside this machine, on loopback."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before Ray is imported: every node, the driver and nfladder bind to loopback, not the host's address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Ray itself is imported by the cluster fixture: a worker that runs none of these tests does not pay for it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs the ray extra: pip install "noisefloor[ray]"')

NFLADDER = str(Path(sys.executable).with_name("nfladder"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """A head that runs no agent (0 CPUs) and two worker nodes of 2 CPUs each. Ray's options cut only
    its own CPU: idle workers are kept for the next condition and grading (Ray kills an idle worker
    after 1 s by default, and each new one imports Ray and the executor again, ~1.5 CPU-s); no
    autoscaler monitor, metrics or log monitor (nfladder does not forward workers' logs) on a fixed
    cluster; no worker started before a run asks."""
    config = {"idle_worker_killing_time_threshold_ms": 600_000, "enable_metrics_collection": False,
              "enable_worker_prestart": False, "prestart_worker_first_driver": False,
              "health_check_period_ms": 1000}  # the killed node found dead in ~5 s, not ~15
    from ray import cluster_utils

    c = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "no_monitor": True, "include_log_monitor": False,
        "_system_config": config})
    workers = [c.add_node(num_cpus=2, node_ip_address="127.0.0.1") for _ in range(2)]
    c.wait_for_nodes()
    c.workers = workers  # type: ignore[attr-defined]
    yield c
    c.shutdown()


TASKS, REPLICATES = 4, 2  # 8 runs a condition, 24 in all: each node gets several of every condition
RUNS = TASKS * REPLICATES


def ladder(out: Path, *extra: str, address: str | None = None) -> subprocess.Popen[str]:
    args = [NFLADDER, "run", "--tasks", str(TASKS), "-R", str(REPLICATES), "-j", "2", "--bootstrap", "200",
            "--seed", "4",
            "--out", str(out), *extra]
    if address:
        args += ["--executor", "ray", "--ray-address", address]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return out, err


def _children(pid: int) -> list[int]:
    """`pid`'s child processes (each thread keeps its own list); none once it has ended."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


class NodeAgents:
    """The agent runs on one node as its processes show them: each Ray worker under the node's
    raylet and the agent processes it started, remembered once seen."""

    def __init__(self, raylet: int) -> None:
        self.raylet = raylet
        self.seen: dict[int, set[int]] = {}  # worker pid -> agent pids it has started
        self.alive: set[int] = set()

    def poll(self) -> None:
        self.alive = set()
        for worker in _children(self.raylet):
            for child in _children(worker):
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"noisefloor.ladder.agent" in argv:
                    self.seen.setdefault(worker, set()).add(child)
                    self.alive.add(child)

    def finished_and_running(self) -> bool:
        """A run has finished on the node (its recording is in the node's shard) and one is in flight."""
        self.poll()
        return bool(self.alive) and any(agents - self.alive for agents in self.seen.values())


def test_ray_ladder_equals_the_local_ladder_for_the_same_seed(tmp_path, cluster):
    _, err = finish(ladder(tmp_path / "ray", address=cluster.address))
    finish(ladder(tmp_path / "local"))
    ray_doc = json.loads((tmp_path / "ray" / "report.json").read_text())
    local = json.loads((tmp_path / "local" / "report.json").read_text())
    # The provider draws by (task, temperature, n-th request), so each task's outcomes in live and t0
    # are the same multiset whatever the order of the runs: the same statistics to the last digit.
    for cond in ("live", "t0"):
        assert ray_doc["conditions"][cond] == local["conditions"][cond], cond
    pair = [[c for c in doc["contrasts"] if (c["a"], c["b"]) == ("live", "t0")] for doc in (ray_doc, local)]
    assert pair[0] == pair[1] and len(pair[0]) == 1
    # Replay serves t0 replicate 0, which got whichever draw its request arrived for: not comparable
    # across executors (nor across two local runs with -j 2), but strict and noise-free in both.
    for doc in (ray_doc, local):
        assert doc["conditions"]["replay"]["w"] == 0.0 and doc["log"]["conditions"]["replay"]["misses"] == 0
    assert ray_doc["log"]["conditions"]["live"]["exchanges"] == RUNS
    assert "[ray] 3 nodes" in err and f"grading {3 * RUNS} candidates" in err
    assert not (tmp_path / "ray" / "shards").exists() or not any((tmp_path / "ray" / "shards").iterdir())


def test_a_node_killed_mid_run_loses_only_runs_that_run_again(tmp_path, cluster):
    """The node dies while recording t0, with a run finished there (its shard goes with the node: the
    run runs again elsewhere, or, if its result had not reached the driver yet, Ray retries it) and
    one in flight (Ray retries it): every run is counted once either way. t0 and the replay of its
    merged log only: live would add a condition that the node's death never touches."""
    out = tmp_path / "killed"
    node = NodeAgents(cluster.workers[0].all_processes["raylet"][0].process.pid)
    # the built-in agent as a script (it runs in the executor's thread otherwise): the node's agent
    # processes are what says that a run is in flight there
    agent = f"{sys.executable} -m noisefloor.ladder.agent {{task_file}}"
    p = ladder(out, "--latency-ms", "700", "--conditions", "t0,replay", "--agent", agent, address=cluster.address)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 300
    while not node.finished_and_running():  # each run lasts 700 ms or more: 0.1 s polls see every one
        assert time.monotonic() < deadline and p.poll() is None, "no t0 run finished with another in flight"
        time.sleep(0.1)
    cluster.remove_node(cluster.workers[0], allow_graceful=False)
    p.wait(600)
    reader.join(10)
    err = "".join(lines)
    assert p.returncode == 0, err[-3000:]
    # lost while t0 recorded (replay, after it, reports the dead node again)
    assert -1 < err.find("was lost") < err.find("[replay] "), err
    rows = [json.loads(x) for x in (out / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * RUNS and not any(r["failure"].startswith("agent_") for r in rows)
    from noisefloor.proxy.store.log import Store

    with Store.open(out / "log.lmdb", write=False) as s:
        sessions = {ex.session for ex in s.exchanges()}
    assert len(sessions) == 2 * RUNS  # every run's exchanges are in the merged log, none twice-counted
    doc = json.loads((out / "report.json").read_text())
    assert doc["log"]["conditions"]["replay"]["misses"] == 0


def test_gate_design_on_ray_stamps_its_collections_and_gives_verdicts(tmp_path, cluster):
    out = tmp_path / "gate"
    r = subprocess.run([NFLADDER, "run", "--design", "gate", "--tasks", "3", "--k", "2", "--escalate-at", "4",
                        "-j", "2", "--bootstrap", "100", "--out", str(out), "--executor", "ray",
                        "--ray-address", cluster.address], capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: the demo candidate's broken cases regressed
    doc = json.loads((out / "report.json").read_text())
    assert doc["gate"]["refused"] is None and len(doc["gate"]["verdicts"]) == 3
    assert (r.returncode == 1) == (doc["gate"]["counts"]["regressed"] > 0)
