"""`nfladder run --executor ray`: agent runs as Ray tasks over a cluster.

Each node with CPUs gets one actor that owns the node's nfproxy processes (one per condition, as
on one machine, all started by the driver before the condition's runs), each recording into a
store shard on that node's own disk. When a
condition ends, every actor stops its proxy and sends back a compact copy of its shard through
Ray's object store; the driver merges the shards into the study's log (`nfproxy merge`, so a
damaged shard is refused by name). Replay ships the merged log the same way, to every node that
replays: the object store reaches every node of any cluster, where a shared path would have to be
set up first. Grading fans out as Ray tasks, each with the dataset shipped to it; the analysis
runs where the command was started.

A node lost mid-run loses its unfinished runs, which Ray retries on other nodes (bounded), and its
shard: the runs it had finished are run again elsewhere, once more at most, before the condition
counts as done. Replay keeps the guarantees of one machine: every node's proxy is strict and has
no upstream, and a miss on any node fails the condition with exit 3.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from noisefloor.ladder.agent_run import AgentRun, Attempt, run_agent
from noisefloor.ladder.executors import ExecutorError, Items, grade_here, start_proxy
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.store.merge.run import merge
from noisefloor.verifier.grading import GradeOptions

NAMESPACE = "noisefloor"
TASK_RETRIES = 3  # Ray's retries of an agent run whose node died under it
RERUN_ROUNDS = 1  # extra rounds for finished runs whose node (and shard) was lost
FINISH_TIMEOUT = 120.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError('--executor ray needs Ray: pip install "noisefloor[ray]"') from None
    return ray


def _shard_bytes(path: Path) -> bytes:
    """A compact copy of a store, as bytes to ship."""
    with tempfile.TemporaryDirectory(prefix="nf-shard-") as tmp:
        with Store.open(path, write=False) as store:
            store.tables.copy_to(Path(tmp))
        return (Path(tmp) / "data.mdb").read_bytes()


def _unpack(data: bytes, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "data.mdb").write_bytes(data)
    return path


class NodeProxies:
    """One per node (a Ray actor): the node's nfproxy processes and their shards."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="nfladder-ray-"))
        self.proxies: dict[str, Any] = {}

    def port(self, key: str, args: list[str], shipped: list[Any]) -> tuple[int, str]:
        """The condition's proxy port on this node (started on first use), and where task files go."""
        if key not in self.proxies:
            store = self.root / key / "log.lmdb"
            if shipped[0] is not None:  # replay: the merged recording, shipped through the object store
                _unpack(_ray().get(shipped[0]), store)
            self.proxies[key] = (start_proxy(["--store", str(store), *args]), store)
        return self.proxies[key][0].port, str(self.root / "tasks")

    def finish(self, key: str) -> tuple[int, bytes | None]:
        """Stop this condition's proxy; its exit status and its shard."""
        if key not in self.proxies:
            return 0, None
        proxy, store = self.proxies.pop(key)
        code = proxy.stop(timeout=60)
        return code, _shard_bytes(store) if (store / "data.mdb").exists() else None

    def close(self) -> None:
        for proxy, _ in self.proxies.values():
            proxy.stop(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _actor_for(study: str, node: str) -> Any:
    """The study's actor on `node`, started by the first run there. Detached: an actor owned by the
    task that started it would end with that task."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(num_cpus=0, max_restarts=0)(NodeProxies).options(
        name=f"nfproxy-{study}-{node}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


def _existing_actor(study: str, node: str) -> Any | None:
    """The node's actor if it still lives; a new one would hold nothing of what the old one recorded."""
    try:
        return _ray().get_actor(f"nfproxy-{study}-{node}", namespace=NAMESPACE)
    except ValueError:
        return None


def _agent_task(study: str, run: AgentRun, key: str, args: list[str], shipped: list[Any],
                ready: dict[str, tuple[int, str]]) -> tuple[Attempt, str]:
    """A Ray task: one agent run behind its own node's proxy for the condition. `ready` holds the
    proxies started before the runs; only a node that joined since asks its actor (a task blocked in
    `ray.get` gives its CPU back, and Ray starts another worker process to fill it)."""
    ray = _ray()
    node = ray.get_runtime_context().get_node_id()
    if node in ready:
        port, taskdir = ready[node]
    else:
        port, taskdir = ray.get(_actor_for(study, node).port.remote(key, args, shipped))
    return run_agent(run, port, Path(taskdir)), node


def _grade_task(kind: str, dataset: bytes, suffix: str, options: GradeOptions, items: Items) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="nf-grade-") as tmp:
        path = Path(tmp) / f"dataset{suffix}"
        path.write_bytes(dataset)
        return grade_here(kind, path, options, items)


class RayExecutor:
    def __init__(self, address: str | None, out: Path, say: Callable[[str], None]) -> None:
        ray = _ray()
        self.say = say
        self.out = out
        local: dict[str, Any] = {} if address else {"include_dashboard": False}  # only a new local Ray takes these
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, **local)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ExecutorError(f"cannot join Ray at {address or 'a local Ray'}: {exc}; start a cluster with "
                                "`ray start --head` or give --ray-address") from None
        self._agent = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(_agent_task)
        self._grade = ray.remote(max_retries=TASK_RETRIES)(_grade_task)
        self._nodes: set[str] = set()
        self.study = uuid.uuid4().hex[:12]  # names this run's actors: two studies on one cluster never share
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        say(f"[ray] {len(nodes)} nodes, {int(ray.cluster_resources().get('CPU', 0))} CPUs")

    def run(self, runs: Sequence[AgentRun], proxy_args: Sequence[str], store: Path,
            on_done: Callable[[Attempt], None], replay: bool = False) -> int:
        ray = _ray()
        key = f"{runs[0].condition}-{uuid.uuid4().hex[:8]}" if runs else "none"
        shipped = [ray.put(_shard_bytes(store)) if replay else None]
        worst, todo = 0, list(runs)
        for round_ in range(RERUN_ROUNDS + 1):
            finished = self._run_round(todo, key, list(proxy_args), shipped)
            code, lost = self._collect(key, store)
            worst = max(worst, code)
            again = [run for run, (_, node) in finished.items() if node in lost]
            for attempt, node in finished.values():
                if node not in lost:
                    on_done(attempt)
            if not again:
                break
            if round_ == RERUN_ROUNDS:
                raise ExecutorError(f"{len(again)} runs were lost with their nodes twice; rerun the same command "
                                    "to resume them")
            self.say(f"[ray] {len(again)} finished runs were lost with their node's shard; running them again")
            todo = again
        return worst

    def _run_round(self, runs: list[AgentRun], key: str, args: list[str], shipped: list[Any],
                   ) -> dict[AgentRun, tuple[Attempt, str]]:
        ray = _ray()
        ready = self._start_proxies(key, args, shipped, len(runs))
        pending = {self._agent.remote(self.study, run, key, args, shipped, ready): run for run in runs}
        finished: dict[AgentRun, tuple[Attempt, str]] = {}
        failed: list[str] = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                run = pending.pop(ref)
                try:
                    attempt, node = ray.get(ref)
                except ray.exceptions.RayError as exc:  # retried on other nodes and still failing
                    failed.append(f"{run.session}: {exc.__class__.__name__}")
                    continue
                finished[run] = (attempt, node)
                self._nodes.add(node)
                if len(finished) % 25 == 0 or not pending:
                    self.say(f"[ray] {len(finished)}/{len(runs)} agent runs finished")
        if failed:
            raise ExecutorError(f"{len(failed)} agent runs failed on every node Ray tried (e.g. {failed[0]}); "
                                "rerun the same command to resume them")
        return finished

    def _start_proxies(self, key: str, args: list[str], shipped: list[Any], runs: int) -> dict[str, tuple[int, str]]:
        """The condition's proxy on the live nodes with CPUs (as many as there are runs), started at
        once: each node's port and task folder. A node that fails here is left to its tasks."""
        ray = _ray()
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        refs = {node: _actor_for(self.study, node).port.remote(key, args, shipped) for node in nodes[:runs]}
        ready: dict[str, tuple[int, str]] = {}
        for node, ref in refs.items():
            try:
                ready[node] = tuple(ray.get(ref, timeout=FINISH_TIMEOUT))
            except ray.exceptions.RayError:  # GetTimeoutError is one
                continue
            self._nodes.add(node)
        return ready

    def _collect(self, key: str, store: Path) -> tuple[int, set[str]]:
        """Stop every node's proxy for `key`, merge the shards into the log; the nodes that were lost."""
        ray = _ray()
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        worst, lost, shards = 0, set(), []
        where = self.out / "shards" / key
        for node in sorted(self._nodes):
            if node not in alive:
                lost.add(node)
                continue
            actor = _existing_actor(self.study, node)
            try:
                if actor is None:
                    raise ray.exceptions.RayActorError()
                code, data = ray.get(actor.finish.remote(key), timeout=FINISH_TIMEOUT)
            except ray.exceptions.RayError:  # GetTimeoutError is one
                lost.add(node)
                continue
            worst = max(worst, code)
            if data is not None:
                shards.append(_unpack(data, where / node[:16]))
        for node in lost:
            self.say(f"[ray] node {node[:12]} was lost; its shard and the runs it held are not merged")
        if shards:
            merge(store, shards)
        shutil.rmtree(where, ignore_errors=True)
        return worst, lost

    def grade(self, kind: str, dataset: Path, options: GradeOptions, items: Items) -> list[Any]:
        ray = _ray()
        if not items:
            return []
        data = ray.put(dataset.read_bytes())
        suffix = "".join(dataset.suffixes)
        per = max(1, -(-len(items) // max(1, int(ray.cluster_resources().get("CPU", 1)))))
        chunks = [list(items[i:i + per]) for i in range(0, len(items), per)]
        self.say(f"[ray] grading {len(items)} candidates in {len(chunks)} tasks")
        results = ray.get([self._grade.remote(kind, data, suffix, options, chunk) for chunk in chunks])
        return [v for chunk in results for v in chunk]

    def close(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            return
        for node in self._nodes:
            actor = _existing_actor(self.study, node)
            if actor is None:
                continue  # a lost node took its folder with it
            try:
                ray.get(actor.close.remote(), timeout=30)
            except ray.exceptions.RayError:  # GetTimeoutError is one
                pass
            ray.kill(actor)  # detached: it would outlive this command otherwise
        ray.shutdown()
