"""Fixtures that start real processes: an aiohttp upstream and `nfproxy` subprocesses on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("NF_SHARED_DATA", ROOT.parent / "shared" / "data"))
START_TIMEOUT = 30.0
HAVE_EVALPLUS = (SHARED_DATA / "evalplus").is_dir()
needs_data = pytest.mark.skipif(not HAVE_EVALPLUS,
                                reason=f"no EvalPlus data at {SHARED_DATA} (set NF_SHARED_DATA)")
needs_bfcl = pytest.mark.skipif(not (SHARED_DATA / "bfcl").is_dir(),
                                reason=f"no BFCL data at {SHARED_DATA} (set NF_SHARED_DATA)")


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


def nfproxy_argv() -> list[str]:
    exe = Path(sys.executable).with_name("nfproxy")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "noisefloor.proxy.cli"]


@dataclass
class ProxyProcess:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def start_nfproxy(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> ProxyProcess:
    """Start `nfproxy run ... --listen 127.0.0.1:0` and wait for its ready line."""
    proc = subprocess.Popen(
        [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd or ROOT,
        env={**os.environ, **(env or {})},
    )
    pp = ProxyProcess(proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            pp.lines.append(line)
            if line.startswith("NFPROXY_READY "):
                pp.port = int(line.rsplit(":", 1)[1])
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while not ready.wait(0.05):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"nfproxy did not become ready in {START_TIMEOUT}s:\n{pp.output}")
    if not pp.port:
        proc.wait(10)
        raise RuntimeError(f"nfproxy exited before listening (rc={proc.returncode}):\n{pp.output}")
    return pp


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


def delete_exchanges(store: Path, ids: list[int]) -> None:
    """Damage a store from outside, as another process could: the exchange records go, the replay
    index keeps naming them."""
    import struct

    import lmdb

    env = lmdb.open(str(store), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"exchanges", txn=txn)
            for i in ids:
                assert txn.delete(struct.pack(">Q", i), db=db), f"no exchange {i} to delete"
    finally:
        env.close()


def have_curl() -> bool:
    return shutil.which("curl") is not None
