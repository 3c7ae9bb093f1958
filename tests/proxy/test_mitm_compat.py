"""The mitmproxy internals nfproxy relies on, one test each, so an upgrade that moves one fails
under that internal's name (the end-to-end proxy tests then only confirm it)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from noisefloor.proxy.mitm import compat as mitm_compat
from tests import loopback
from tests.conftest import ROOT


@pytest.mark.parametrize("internal", list(mitm_compat.INTERNALS))
def test_internal_is_where_nfproxy_expects_it(internal):
    try:
        mitm_compat.INTERNALS[internal]()
    except Exception as exc:  # noqa: BLE001 - the report is the point
        pytest.fail(f"mitmproxy {mitm_compat.VERSION} moved {internal}: {exc}; adapt proxy/mitm/compat.py")


def test_probe_reports_a_moved_internal_by_name(monkeypatch):
    monkeypatch.setitem(mitm_compat.INTERNALS, "mitmproxy.gone.Thing", mitm_compat._exists("mitmproxy.gone.Thing"))
    monkeypatch.setitem(mitm_compat.INTERNALS, "Response lost trailers",
                        mitm_compat._params("mitmproxy.http.Response.__init__", ("http_version", "trailers")))
    problems = mitm_compat.probe()
    assert set(problems) == {"mitmproxy.gone.Thing", "Response lost trailers"}
    assert "mitmproxy.gone is gone" in problems["mitmproxy.gone.Thing"]
    assert "no longer takes (http_version, trailers)" in problems["Response lost trailers"]


def test_probe_names_a_new_reader_of_the_ca_the_lazy_ca_would_not_load_first(monkeypatch):
    from mitmproxy.addons.tlsconfig import TlsConfig

    def dtls_start_client(self, data):  # an upgrade's new hook, reading the CA through get_cert
        return self.get_cert(data.context)

    monkeypatch.setattr(TlsConfig, "dtls_start_client", dtls_start_client, raising=False)
    (problem,) = [v for k, v in mitm_compat.probe().items() if "lazy CA" in k]
    assert "reads its CA in dtls_start_client too" in problem


def test_the_line_matches_the_python_it_is_tested_on():
    # environment markers choose it: 11.0 on 3.11, 12.3 on 3.12 and later
    assert mitm_compat.LINE == (11 if sys.version_info < (3, 12) else 12), mitm_compat.VERSION


def test_the_ca_is_created_under_the_file_name_clients_are_given(tmp_path):
    cert = mitm_compat.ensure_ca(tmp_path / "ca")
    assert cert == tmp_path / "ca" / mitm_compat.CA_CERT_FILE == mitm_compat.ca_cert_path(tmp_path / "ca")
    assert cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    first = cert.read_bytes()
    mitm_compat.ensure_ca(tmp_path / "ca")
    assert cert.read_bytes() == first  # reused, not replaced


def test_built_response_keeps_the_encoded_body_as_given():
    import gzip

    body = gzip.compress(b'{"ok": true}')
    resp = mitm_compat.build_response(200, ((b"content-encoding", b"gzip"), (b"x-a", b"1"), (b"x-a", b"2")), body)
    assert resp.status_code == 200 and resp.reason == "OK" and resp.http_version == "HTTP/1.1"
    assert resp.raw_content == body and resp.content == b'{"ok": true}'
    assert resp.headers.get_all("x-a") == ["1", "2"]
    made = mitm_compat.make_response(507, b'{"error": 1}', {"content-type": "application/json"})
    assert made.status_code == 507 and made.content == b'{"error": 1}'


def test_lean_master_has_exactly_the_addons_a_recording_proxy_needs():
    async def build() -> list[str]:
        master = mitm_compat.lean_master(sys.stderr)
        try:
            return sorted(type(a).__name__ for a in master.addons.chain)
        finally:
            master.shutdown()

    names = asyncio.run(build())
    assert names == sorted(["Core", "Block", "DisableH2C", "Proxyserver", "NextLayer", "TlsConfig", "UpdateAltSvc",
                            "ErrorCheck", "TermLog"])


def test_no_other_module_imports_mitmproxy():
    import re

    root = ROOT
    pattern = re.compile(r"^\s*(from|import)\s+mitmproxy\b", re.M)
    parts = [d for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists() and d.name != "tests"]
    offenders = [str(p.relative_to(root)) for part in [*parts, root / "src"]
                 for p in part.rglob("*.py") if p.relative_to(root).as_posix() != "proxy/mitm/compat.py" and pattern.search(p.read_text())]
    assert offenders == [], f"import mitmproxy only through proxy/mitm/compat.py: {offenders}"


def test_a_reverse_proxy_reads_its_ca_only_when_a_client_speaks_tls(tmp_path, upstream, proxies):
    """The lazy CA: starting nfproxy in reverse mode reads and creates no CA; on mitmproxy 11 plain
    HTTP clients (nfladder's, most harnesses') never make it read one, on 12.3 its per-request TLS
    hook reads it at the first request; the first TLS client gets a certificate that chains to it."""
    import httpx

    from tests.conftest import start_nfproxy

    confdir = tmp_path / "ca"
    rec = start_nfproxy("--mode", "record", "--store", str(tmp_path / "log.lmdb"), "--upstream", upstream.url,
                        "--confdir", str(confdir))
    proxies.append(rec)
    assert not confdir.exists()  # listening, and nothing read or created
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert loopback.post(rec.url + "/v1/chat/completions", json=body, timeout=20).status_code == 200
    assert confdir.exists() == (mitm_compat.LINE >= 12)  # 12.3's `request` hook reads the CA
    tls_url = f"https://127.0.0.1:{rec.port}/v1/chat/completions"
    assert httpx.post(tls_url, json=body, verify=False, timeout=20).status_code == 200
    cert = mitm_compat.ca_cert_path(confdir)
    assert cert.is_file()
    import ssl

    assert httpx.post(tls_url, json=body, verify=ssl.create_default_context(cafile=str(cert)),
                      timeout=20).status_code == 200
    assert rec.stop() == 0
