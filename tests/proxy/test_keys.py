"""Canonical form and key: what moves the key and what must not."""

from __future__ import annotations

import gzip
import json
import zlib

import brotli
import pytest
import zstandard

from noisefloor.proxy.request import secrets
from noisefloor.proxy.request.decoding import decode_body
from noisefloor.proxy.request.keys import RuleError, Rules, drop_pointer, parse_pointer
from noisefloor.proxy.request.traffic import RequestData

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"request_id": "r1"}}


def req(body: bytes, path: str = "/v1/chat/completions", headers: tuple = (), host: str = "api.openai.com") -> RequestData:
    return RequestData("POST", f"https://{host}{path}", host, path, headers, body)


def key(r: RequestData, rules: Rules | None = None) -> str:
    return r.canonical(rules or Rules()).key


def test_key_ignores_json_layout_and_secrets_but_not_content():
    base = key(req(json.dumps(BODY).encode()))
    assert key(req(json.dumps(BODY, indent=3, sort_keys=True).encode())) == base
    assert key(req(json.dumps(BODY).encode(), headers=(("authorization", "Bearer a"), ("x-api-key", "b")))) == base
    assert key(req(json.dumps(BODY).encode(), headers=(("x-stainless-retry-count", "2"),))) == base
    assert key(req(json.dumps(dict(BODY, model="n")).encode())) != base
    assert key(req(json.dumps(BODY).encode(), headers=(("anthropic-version", "2023-06-01"),))) != base
    assert key(req(json.dumps(BODY).encode(), host="api.anthropic.com")) != base
    assert key(req(json.dumps(BODY).encode(), host="api.openai.com:443")) == base


def test_a_request_asked_again_is_keyed_as_a_first_one_under_its_own_rules_and_headers():
    """Canonical forms are remembered per request (method, host, path, headers, body, rules): one
    asked again, under other rules, with another keyed header, or with other bytes of the same
    JSON, gets what keying it afresh gives; a body over the remembered size is keyed afresh."""
    from noisefloor.proxy.request import traffic
    from noisefloor.proxy.request.keys import canonicalize

    traffic._canonical.cache_clear()
    body = json.dumps(BODY).encode()
    cases = [(req(body), Rules()), (req(body), Rules(ignore_fields=("/metadata",))),
             (req(body, headers=(("anthropic-version", "2023-06-01"),)), Rules()),
             (req(json.dumps(BODY, indent=2).encode()), Rules()), (req(body, host="api.anthropic.com"), Rules()),
             (req(b"x" * (traffic._REMEMBERED_BODY + 1)), Rules())]
    for _ in range(2):
        for r, rules in cases:
            got = r.canonical(rules)
            fresh = canonicalize(r.method, r.host, r.path, r.headers, r.raw_body, rules)
            assert (got.key, got.text, got.notes) == (fresh.key, fresh.text, fresh.notes)
    info = traffic._canonical.cache_info()
    assert (info.hits, info.misses) == (5, 5)  # the large body went around the cache both times
    assert len({r.canonical(rules).key for r, rules in cases[:3]}) == 3


def test_a_provider_registered_later_decides_the_key_of_a_request_asked_before(monkeypatch):
    """A request keyed before a provider that claims its route was registered is keyed by that
    provider once it is (its ignored fields dropped), not from the form remembered before."""
    from noisefloor.proxy import providers
    from noisefloor.proxy.providers.base import Provider

    monkeypatch.setattr(providers, "_ORDER", list(providers._ORDER))
    monkeypatch.setattr(providers, "PROVIDERS", dict(providers.PROVIDERS))
    r = req(json.dumps(BODY).encode(), path="/claimed/v1/run", host="claimed.example")
    before = r.canonical(Rules())
    assert r.canonical(Rules()) is before  # remembered
    claims = Provider(name="claims", matches=lambda host, route: host == "claimed.example",
                      ignore_fields=("/metadata",))
    providers.register(claims)
    after = r.canonical(Rules())
    assert "metadata" in before.text and "metadata" not in after.text


@pytest.mark.parametrize(
    "encoding,compress",
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
    ],
)
def test_key_ignores_transfer_compression(encoding, compress):
    raw = json.dumps(BODY).encode()
    assert key(req(compress(raw), headers=(("content-encoding", encoding),))) == key(req(raw))


def test_query_is_sorted_and_secret_params_dropped():
    a = key(req(b"", path="/v1beta/models/g:generateContent?b=2&a=1&key=SECRET1"))
    b = key(req(b"", path="/v1beta/models/g:generateContent?a=1&b=2&key=OTHERKEY"))
    c = key(req(b"", path="/v1beta/models/g:generateContent?a=1&b=3"))
    assert a == b != c


def test_ignore_field_drops_from_key_and_changes_rules_id():
    rules = Rules(ignore_fields=("/metadata/request_id",))
    k1 = key(req(json.dumps(BODY).encode()), rules)
    k2 = key(req(json.dumps(dict(BODY, metadata={"request_id": "r2"})).encode()), rules)
    assert k1 == k2
    assert key(req(json.dumps(BODY).encode())) != key(req(json.dumps(dict(BODY, metadata={"request_id": "x"})).encode()))
    assert rules.id != Rules().id
    assert Rules(ignore_fields=("/a", "/b")).id == Rules(ignore_fields=("/b", "/a", "/a")).id


def test_pointer_wildcards_and_escapes():
    doc = {"messages": [{"id": 1, "c": "x"}, {"id": 2, "c": "y"}], "a/b": {"~k": 1, "z": 2}}
    assert drop_pointer(doc, parse_pointer("/messages/*/id")) == {
        "messages": [{"c": "x"}, {"c": "y"}],
        "a/b": {"~k": 1, "z": 2},
    }
    assert drop_pointer(doc, parse_pointer("/a~1b/~0k"))["a/b"] == {"z": 2}
    assert drop_pointer(doc, parse_pointer("/messages/0"))["messages"] == [{"id": 2, "c": "y"}]
    assert drop_pointer(doc, parse_pointer("/missing/x")) == doc
    with pytest.raises(RuleError, match="must start with '/'"):
        Rules(ignore_fields=("metadata",))


def test_non_json_binary_and_empty_bodies_are_keyed_on_bytes():
    c1 = req(b"{broken").canonical(Rules())
    assert c1.body_kind == "raw" and "not JSON" in c1.notes[0]
    assert key(req(b"{broken")) != key(req(b"{broken!"))
    assert req(bytes(range(256))).canonical(Rules()).body_kind == "raw"
    assert req(b"").canonical(Rules()).body_kind == "empty"
    # a body that claims gzip but is not: keyed on raw bytes with a note, no crash
    bad = req(b"not gzip at all", headers=(("content-encoding", "gzip"),)).canonical(Rules())
    assert any("not decodable" in n for n in bad.notes)


def test_decode_body_layers():
    raw = b'{"x": 1}'
    layered = zlib.compress(gzip.compress(raw))
    assert decode_body(layered, "gzip, deflate") == (raw, None)


def test_scrubbing_helpers():
    assert secrets.scrub_headers([("Authorization", "Bearer x"), ("accept", "a")]) == [
        ("Authorization", "[redacted]"),
        ("accept", "a"),
    ]
    url = secrets.scrub_url("https://user:pw@h/p?key=abcdefgh&alt=json")
    assert "abcdefgh" not in url and "pw" not in url and "alt=json" in url
    values = secrets.secret_values("https://h/p?key=query-secret-1", [("authorization", "Bearer sk-live-123456")])
    assert "sk-live-123456" in values and "query-secret-1" in values
    assert secrets.erase(b"bad key sk-live-123456 given", values) == b"bad key [redacted] given"
