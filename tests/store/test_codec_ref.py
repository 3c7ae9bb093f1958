"""Values compressed against other bodies, decoded in a reused zstd context (`codec._against_prefix`)
and by a decompressor built per value (where zstandard's cffi backend is absent): the same bytes,
the same bound, the same refusal of a damaged frame."""

from __future__ import annotations

import hashlib
import json

import pytest
import zstandard

from noisefloor.proxy.store import _codec as codec


def _chain() -> tuple[codec.Codec, dict[bytes, bytes], list[tuple[bytes, bytes]]]:
    """A conversation's requests, each compressed against the previous request and its answer."""
    c = codec.Codec(lambda key: None)
    stored: dict[bytes, bytes] = {}
    values = []
    messages: list[dict[str, str]] = []
    prev: list[tuple[bytes, bytes]] = []
    for turn in range(6):
        messages.append({"role": "user", "content": f"question {turn}: " + "why " * (40 + turn)})
        body = json.dumps({"model": "m", "messages": messages}).encode()
        answer = json.dumps({"choices": [{"message": {"content": f"answer {turn} " * 30}}]}).encode()
        value = codec.Against(prev).encode(body) if prev else c.encode(body)
        for data in (body, answer):
            stored[hashlib.sha256(data).digest()] = data
        values.append((value, body))
        messages.append({"role": "assistant", "content": f"answer {turn} " * 30})
        prev = [(hashlib.sha256(body).digest(), body), (hashlib.sha256(answer).digest(), answer)]
    return c, stored, values


@pytest.mark.parametrize("cffi", [True, False])
def test_a_chain_reads_back_the_same_with_and_without_the_reused_context(cffi, monkeypatch):
    if not cffi:
        monkeypatch.setattr(codec, "_LIB", None)
    elif codec._cffi() is None:
        pytest.skip("zstandard's cffi backend is not installed")
    c, stored, values = _chain()
    refs = [v for v, _ in values if v[0] == codec.REF]
    assert len(refs) == 5
    for value, body in values:
        assert c.decode(value, len(body), stored.__getitem__) == body
        assert c.decode(memoryview(value), len(body), stored.__getitem__) == body  # as LMDB hands it out
        with pytest.raises(codec.TooLarge):
            c.decode(value, len(body) - 1, stored.__getitem__)


@pytest.mark.parametrize("cffi", [True, False])
def test_a_damaged_frame_or_reference_is_refused_not_misread(cffi, monkeypatch):
    if not cffi:
        monkeypatch.setattr(codec, "_LIB", None)
    c, stored, values = _chain()
    value, body = values[-1]
    damaged = bytearray(value)
    damaged[-3] ^= 0xFF  # the frame's checksum or its last block
    with pytest.raises(zstandard.ZstdError):
        c.decode(bytes(damaged), len(body), stored.__getitem__)
    wrong = {k: b"x" * len(v) for k, v in stored.items()}  # referenced bodies that are not what was compressed against
    try:
        got = c.decode(value, len(body), wrong.__getitem__)
    except zstandard.ZstdError:
        return
    assert got != body  # decoded, but its sha256 (checked by every reader) cannot match
