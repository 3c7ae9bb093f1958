"""nfladder --executor ray on a real multi-node Ray cluster inside this machine, on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until

# Before Ray is imported: every node, the driver and nfladder bind to loopback, not the host's address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
cluster_utils = pytest.importorskip("ray.cluster_utils", reason='needs the ray extra: pip install "noisefloor[ray]"')

NFLADDER = str(Path(sys.executable).with_name("nfladder"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """A head that runs no agent (0 CPUs) and two worker nodes of 2 CPUs each."""
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1"})
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


def finished_runs(out: Path, condition: str) -> int:
    """Runs of `condition` that nfladder has written to attempts.jsonl so far."""
    path = out / "attempts.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return sum(line.endswith("\n") and json.loads(line)["condition"] == condition for line in lines)


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
    out = tmp_path / "killed"
    p = ladder(out, "--latency-ms", "700", address=cluster.address)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    # warm workers: t0 runs have finished on them (2 nodes x 2 CPUs), and the rest of t0's 8 are in
    # flight or to come, each waiting 700 ms on the provider: the node dies holding runs
    wait_until(lambda: finished_runs(out, "t0") >= 2, "two t0 runs finished", timeout=300)
    cluster.remove_node(cluster.workers[0], allow_graceful=False)
    p.wait(600)
    reader.join(10)
    err = "".join(lines)
    assert p.returncode == 0, err[-3000:]
    assert "was lost" in err, err
    rows = [json.loads(x) for x in (out / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * RUNS and not any(r["failure"].startswith("agent_") for r in rows)
    from noisefloor.proxy.store import Store

    with Store.open(out / "log.lmdb", write=False) as s:
        sessions = {ex.session for ex in s.exchanges()}
    assert len(sessions) == 3 * RUNS  # every run's exchanges are in the merged log, none twice-counted
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
