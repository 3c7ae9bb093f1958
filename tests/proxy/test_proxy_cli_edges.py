"""nfproxy's command line at its edges (issue 24 items 6-7, issue 29's typo), with real processes:
Ctrl-C of a wrapped command, SIGTERM, -q, an upstream without a scheme, a busy port, a relative
--store, a mistyped subcommand, and the module form launch.py falls back to."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from noisefloor import exit_codes
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import nfproxy_argv, start_nfproxy, wait_until

AGENT = """
import json, os, signal, sys, urllib.request
signal.signal(signal.SIGINT, lambda *a: sys.exit(130))  # an agent that ends quietly on Ctrl-C
base = os.environ["OPENAI_BASE_URL"]
def post(body):
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "authorization": "Bearer sk-edge-0001"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()
post({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "first"}]})
print("FIRST DONE", flush=True)
post({"model": "gpt-4o-mini", "stream": True, "x_events": 200, "x_pause_ms": 100,
      "messages": [{"role": "user", "content": "second, slow"}]})
print("SECOND DONE", flush=True)
"""


def _run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _wrapped(tmp_path: Path, upstream_url: str, store: Path) -> subprocess.Popen[str]:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    return subprocess.Popen([*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--mode", "record", "--store",
                             str(store), "--upstream", upstream_url, "--", sys.executable, str(agent)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(proc: subprocess.Popen[str], marker: str, timeout: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if marker in line:
            return seen
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{marker!r} never printed: {seen}")


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_ends_with_130_or_143_keeps_the_recording_and_leaves_no_error_exchange(tmp_path, upstream, how):
    store = tmp_path / "s.lmdb"
    proc = _wrapped(tmp_path, upstream.url, store)
    try:
        _wait_for(proc, "FIRST DONE")
        wait_until(lambda: len(upstream.requests) == 2, "the second, streamed request reached the upstream")
        if how == "ctrl-c":  # a terminal's Ctrl-C: SIGINT to the whole foreground group
            os.killpg(proc.pid, signal.SIGINT)
        else:  # SIGTERM to nfproxy alone: it takes the wrapped command with it
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err[-3000:]
    assert "Traceback" not in err and "CancelledError" not in err, err[-3000:]
    assert "nfproxy record: 1 exchanges, 0 errors" in err, err[-2000:]  # the summary, with what was recorded
    assert "SECOND DONE" not in out
    with Store.open(store, write=False) as s:
        exchanges = list(s.exchanges())
    assert len(exchanges) == 1 and exchanges[0].error is None and exchanges[0].response["status"] == 200


def test_quiet_prints_no_ready_line(tmp_path, upstream):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "NFPROXY_READY_LINE"}
    proc = subprocess.Popen([*nfproxy_argv(), "run", "-q", "--listen", f"127.0.0.1:{port}", "--mode", "passthrough",
                             "--upstream", upstream.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # up once it accepts a connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("nfproxy -q never listened")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130  # interrupted, and quiet about it
    assert out == "" and err == "", err


def test_start_refusals_name_the_fix(tmp_path):
    r = _run("--upstream", "127.0.0.1:9100", "--store", str(tmp_path / "a.lmdb"))
    assert r.returncode == exit_codes.USAGE and "http://127.0.0.1:9100" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "a.lmdb").exists()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _run("--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9", "--store", str(tmp_path / "b.lmdb"))
    assert r.returncode == exit_codes.INPUT, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--listen 127.0.0.1:0" in lines[0] and "--mode reverse" not in r.stderr, r.stderr
    assert not (tmp_path / "b.lmdb").exists()  # refused before any work
    # a typo is not a command to wrap: no store, no CA folder, no proxy
    r = _run("lgo", "--store", "x.lmdb", cwd=tmp_path)
    assert r.returncode == exit_codes.USAGE and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["Error: no such command 'lgo' (did you mean `nfproxy log`?); to wrap a "
                                             "command, put it after `--`: nfproxy run [OPTIONS] -- lgo"], r.stderr
    assert list(tmp_path.iterdir()) == []  # no store, no CA folder


def test_relative_store_gives_clients_absolute_ca_paths_and_the_module_form_runs_merge(tmp_path):
    probe = "import os; print(os.environ['SSL_CERT_FILE']); print(os.environ['NODE_EXTRA_CA_CERTS'])"
    r = _run("run", "--listen", "127.0.0.1:0", "--mode", "passthrough", "--store", "rel/s.lmdb", "--",
             sys.executable, "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    paths = r.stdout.split()
    assert len(paths) == 2 and all(os.path.isabs(p) for p in paths), r.stdout
    assert Path(paths[0]) == tmp_path / "rel" / "mitmproxy-ca" / "mitmproxy-ca-cert.pem"
    r = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "merge", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "Combine stores" in r.stdout, r.stdout + r.stderr
    # the module form runs merge itself, not a proxy wrapping `merge`
    shard = tmp_path / "rel" / "s.lmdb"
    with Store.open(shard, write=True, create=True) as s:
        s.bind_rules("r", {})
    r = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "merge", str(tmp_path / "m.lmdb"), str(shard)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("merged 1 shards into "), r.stdout + r.stderr


def test_log_shows_client_labels_with_escapes_visible(tmp_path, upstream, proxies):
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    label = "s1\x1b]0;pwned\x07\x9b31m\u202e"
    r = loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=20,
                   headers={"x-nf-session": label.encode("utf-8"), "x-nf-condition": "c\x1b[2J"})
    assert r.status_code == 200
    assert rec.stop() == 0
    for args in (("log",), ("log", "--json"), ("show", "1")):
        out = _run(*args, "--store", str(store)).stdout
        assert "s1" in out and not any(c in out for c in "\x1b\x07\x9b\u202e"), (args, out)
        if args != ("log",):  # still JSON, and the label read back is the one sent
            docs = [json.loads(line) for line in out.splitlines()] if args[1] == "--json" else [json.loads(out)]
            assert docs[0]["session"] == label


def test_a_hostile_perturbation_file_is_one_line(tmp_path):
    for name, text in (("deep.json", "[" * 200_000), ("types.json", '{"v": {"prefix": [1]}}'),
                       ("latin1.json", b'{"v": {"prefix": "caf\xe9"}}')):
        f = tmp_path / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        r = _run("run", "--perturb-file", str(f), "--perturb", "v", "--store", str(tmp_path / "x.lmdb"))
        assert r.returncode == exit_codes.USAGE and "Traceback" not in r.stderr and str(f) in r.stderr, r.stderr
    assert not (tmp_path / "x.lmdb").exists()


def test_the_cli_starts_without_numpy_or_aiohttp():
    """Start-up cost: numpy (sketches: recording, a replay's miss) and aiohttp (replayed streams)
    are imported only when a request needs them, not by every nfproxy process."""
    code = "import sys, noisefloor.proxy.cli; print(sorted(m for m in ('numpy', 'aiohttp') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_every_store_command_takes_the_store_first_and_store_as_the_same(tmp_path, upstream, proxies):
    """One convention: `nfproxy CMD STORE ...` as `nfanalyze STORE` and `nfview STORE`; `--store STORE`
    says the same; both at once is a usage error in one line."""
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    assert loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=20).status_code == 200
    assert rec.stop() == 0
    for first, alias in ((("log", str(store)), ("log", "--store", str(store))),
                         (("show", str(store), "1"), ("show", "1", "--store", str(store))),
                         (("export", str(store), "--format", "jsonl"), ("export", "--store", str(store), "--format", "jsonl"))):
        a, b = _run(*first), _run(*alias)
        assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and a.stdout, (first, a.stderr, b.stderr)
    har = tmp_path / "s.har"
    assert _run("export", str(store), "-o", str(har)).returncode == 0
    for n, args in enumerate((("import", str(tmp_path / "i0.lmdb"), str(har)), ("import", "--store", str(tmp_path / "i1.lmdb"), str(har)))):
        assert _run(*args).returncode == 0, args
        with Store.open(tmp_path / f"i{n}.lmdb", write=False) as imported:
            assert len(imported) == 1
    for args in (("compact", str(store)), ("repair", "--store", str(store))):
        assert _run(*args).returncode == 0, args
    twice = _run("log", str(store), "--store", str(store))
    assert twice.returncode == exit_codes.USAGE and "unexpected arguments" in twice.stderr
    nothing = _run("import", str(tmp_path / "i2.lmdb"))
    assert nothing.returncode == exit_codes.USAGE and "Traceback" not in nothing.stderr
