"""Fixtures that start real processes: an aiohttp upstream and `nfproxy` subprocesses on loopback."""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from noisefloor.proxy.launch import RunningProxy, start
from noisefloor.proxy.launch import nfproxy_argv as nfproxy_argv  # re-exported for the tests
from tests.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"  # the fixtures the repository keeps (stores made by earlier mains)
SHARED_DATA = Path(os.environ.get("NF_SHARED_DATA", ROOT.parent / "shared" / "data"))
START_TIMEOUT = 30.0
HAVE_EVALPLUS = (SHARED_DATA / "evalplus").is_dir()
needs_data = pytest.mark.skipif(not HAVE_EVALPLUS,
                                reason=f"no EvalPlus data at {SHARED_DATA} (set NF_SHARED_DATA)")
needs_bfcl = pytest.mark.skipif(not (SHARED_DATA / "bfcl").is_dir(),
                                reason=f"no BFCL data at {SHARED_DATA} (set NF_SHARED_DATA)")


PACKAGE_DIRS = ("src/noisefloor", "proxy", "analyzer", "verifier", "ladder", "viewer")


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package once, as pip does for an installed one. The suite starts some 600
    Python processes of it (nfproxy, nfladder, nfanalyze, nfverify); with PYTHONDONTWRITEBYTECODE
    set, as on this project's machines, each would compile the modules it imports from source
    (0.1-0.25 CPU-s a process). Only the controller compiles; its workers start after."""
    if sys.flags.dont_write_bytecode and not hasattr(config, "workerinput"):
        for d in PACKAGE_DIRS:
            compileall.compile_dir(ROOT / d, quiet=2, workers=1)


_last_test: list[str] = ["(none yet)"]


def _restore_terminal_sigint(where: str) -> None:
    """SIGINT back to what a terminal gives (neither ignored nor blocked), said with where it changed."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())
    handler = signal.getsignal(signal.SIGINT)
    if blocked or handler is not signal.default_int_handler:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.warn(f"SIGINT {'blocked' if blocked else repr(handler)} {where}; restored", stacklevel=1)


@pytest.fixture(autouse=True)
def terminal_signals(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts its processes as a terminal would: SIGINT neither ignored nor blocked. A child
    inherits both from this worker, so one library that changed them in-process (seen once in a full
    run: nfverify and nfladder children then ignored the Ctrl-C tests' SIGINT) would change how the
    processes of every later test on this worker take a Ctrl-C. Checked before and after each test:
    a change found before it was made between tests (a wider fixture's set-up or tear-down)."""
    _restore_terminal_sigint(f"between {_last_test[0]} and {request.node.nodeid}")
    yield
    _restore_terminal_sigint(f"during {request.node.nodeid}")
    _last_test[0] = request.node.nodeid


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Tests never read or write the user's ~/.cache/noisefloor; processes they start inherit this.
    Datasets come from NF_SHARED_DATA (or ../shared/data), never from a download."""
    path = tmp_path_factory.mktemp("nfcache")
    old = os.environ.get("NF_CACHE_DIR")
    os.environ["NF_CACHE_DIR"] = str(path)
    if SHARED_DATA.is_dir():
        os.environ.setdefault("NF_SHARED_DATA", str(SHARED_DATA))
    yield path
    if old is None:
        os.environ.pop("NF_CACHE_DIR", None)
    else:
        os.environ["NF_CACHE_DIR"] = old


# The end-to-end tests that start whole ladders, SDK harnesses, Ray clusters or graders over full
# data sets: `-m "not slow"` leaves them out for a fast inner loop (CI runs everything).
SLOW = ("tests/ladder/", "tests/proxy/test_inspect.py", "tests/proxy/test_litellm.py", "tests/proxy/test_node_sdk.py",
        "tests/proxy/test_current_sdks.py", "tests/proxy/test_pytest_plugin.py", "tests/proxy/test_interrupts.py",
        "tests/verifier/test_verifier_grading.py", "tests/verifier/test_bfcl_audit.py", "tests/verifier/test_bfcl_parity.py",
        "tests/verifier/test_verifier_hostile.py", "tests/store/test_merge.py", "tests/analyzer/test_stored_rows.py",
        "tests/viewer/")


@pytest.hookimpl(tryfirst=True)
def pytest_itemcollected(item: pytest.Item) -> None:
    if item.path.relative_to(ROOT).as_posix().startswith(SLOW):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own pass over the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's loadgroup (pyproject's addopts) each worker builds its own copy of a
    module- or session-scoped fixture: tests that share one defined in their module (a Ray cluster,
    a browser, a ladder run, graders) get one xdist_group so it is built once. A test with an
    explicit xdist_group keeps only that."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    shared: dict[pytest.Item, list[str]] = {}
    for item in items:
        info, module = getattr(item, "_fixtureinfo", None), getattr(item, "module", None)
        if info is None or module is None or item.get_closest_marker("xdist_group"):
            continue
        keys = [f"{item.path.stem}.{name}" for name, defs in info.name2fixturedefs.items()
                if defs and defs[-1].scope in ("module", "session")
                and getattr(defs[-1].func, "__module__", None) == module.__name__]
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
        if keys:
            shared[item] = keys
    for item, keys in shared.items():
        item.add_marker(pytest.mark.xdist_group(root(keys[0])))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for item in items:
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """loadgroup schedules by a `@group` suffix on the node id, which pytest-xdist 3.8 writes to a
    field pytest 9.2 no longer reads (pytest-xdist issue 1386): written here where it is missing."""
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})
    if not groups or "@" in item.nodeid.rpartition("]")[2]:
        return
    named = f"{item.nodeid}@{'_'.join(groups)}"
    if hasattr(item, "_id"):
        item._id = type(item._id).parse(named)
    else:
        item._nodeid = named


# The tests start nfproxy the way nfladder does: one launcher.
ProxyProcess = RunningProxy


def start_nfproxy(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> RunningProxy:
    return start(*args, cwd=cwd or ROOT, env=env, timeout=START_TIMEOUT)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def proxies() -> Iterator[list[ProxyProcess]]:
    """Collects started proxies and makes sure none outlives its test."""
    started: list[ProxyProcess] = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL, timeout=5)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "log.lmdb"


def recorded_shards(where: Path, exchanges: int) -> list[Path]:
    """Two stores of `exchanges` each, recorded through the real recorder (bench/store_traffic's
    multi-turn sessions, different in each shard): what the merge tests merge."""
    from bench.store_traffic import record
    from noisefloor.proxy.store.log import Store

    paths = [where / "a.lmdb", where / "b.lmdb"]
    for seed, path in enumerate(paths):
        with Store.open(path, write=True, create=True) as s:
            record(s, exchanges, seed=seed, prefix=f"sh{seed}")
    return paths


def delete_exchanges(store: Path, ids: list[int]) -> None:
    """Damage a store from outside, as another process could: the exchange records go (with their
    heads, so listings still agree with the records), the replay index keeps naming them."""
    import struct

    import lmdb

    env = lmdb.open(str(store), max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"exchanges", txn=txn)
            heads = env.open_db(b"heads", txn=txn, create=False) if txn.get(b"heads") is not None else None
            for i in ids:
                assert txn.delete(struct.pack(">Q", i), db=db), f"no exchange {i} to delete"
                if heads is not None:
                    assert txn.delete(struct.pack(">Q", i), db=heads), f"no head {i} to delete"
    finally:
        env.close()


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll `condition` until it holds, failing with `what` after `timeout` s: a test waits for the
    state it needs, never for a fixed time that a loaded machine may not honour."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


def have_curl() -> bool:
    return shutil.which("curl") is not None


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 40 MB tmpfs: a real full disk without filling the machine's (needs root)."""
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40M", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)
