"""Finding and erasing known secret values in bytes or text: the one rule every stored or printed
copy goes through.

A value is erased where it appears whole, in any spelling `secrets.forms` gives it, and so is
every run of `RUN` or more consecutive characters of it (an upstream or a model that echoes part
of a key). Both are also searched for after undoing the escapes a JSON string or a URL may hold
(`\\u0073`, `\\/`, `%73`), mixed with plain characters as they may be; the stored bytes keep
their spelling and lose the span.

Runs are found without scanning every position: every `RUN`-long window of a value holds one
whole block of `RUN // 2` characters at an offset that is a multiple of `RUN // 2`, so searching
for those few blocks (C-speed `find`) and extending each hit both ways finds every run.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import AnyStr

REDACTED = "[redacted]"
RUN = 20  # a run of this many characters of a secret is erased as if it were the secret
_BLOCK = RUN // 2
_SEPARATORS = frozenset(" \t;,=")  # a value holding these is a composite (a header); its parts are values too


@dataclass(frozen=True)
class _Plan:
    whole: tuple[AnyStr, ...]  # values searched whole (those no run search finds), longest first
    runs: tuple[AnyStr, ...]  # values long enough to have runs, searched block by block
    escapes: re.Pattern[AnyStr]
    mask: bytes | None = None  # bytes: a translate table sending every byte no spelling of a run holds to NUL


_ESCAPE_BYTES = b"\\%u/\"0123456789abcdefABCDEF"  # what an escaped character is written with
_MAX_WINDOWS = 64  # more candidate stretches than this: search the whole text instead

# escapes that decode to printable ASCII: a key's characters (anything else cannot be inside a run)
_ESC_STR = r"[\\%](?:(?<=\\)u00[2-7][0-9a-fA-F]|(?<=\\)[/\"\\]|(?<=%)[2-7][0-9a-fA-F])"
_ESC_ANY = r"[\\%](?:(?<=\\)u[0-9a-fA-F]{4}|(?<=\\)[/\"\\]|(?<=%)[0-9a-fA-F]{2})"


@lru_cache(maxsize=512)
def _plan(values: tuple[str, ...], as_bytes: bool) -> _Plan:
    vals = sorted(set(values), key=len, reverse=True)
    pattern = _ESC_STR if all(v.isascii() for v in vals) else _ESC_ANY
    runs = [v for v in vals if len(v) >= RUN and not _SEPARATORS.intersection(v)]
    runs = [v for v in runs if not any(o != v and o in v for o in runs)]  # a spelling around another: its runs suffice
    # whole values: those the runs do not find, and of those only the ones holding no other (the inner
    # one's mark is enough, and one search for it answers for all that hold it)
    vals = [v for v in vals if not any(r in v for r in runs)]
    vals = [v for v in vals if not any(o != v and o in v for o in vals)]
    if as_bytes:
        enc = [v.encode("utf-8", "surrogateescape") for v in vals]
        renc = [v.encode("utf-8", "surrogateescape") for v in runs]
        alphabet = (set(b"".join(renc)) | set(_ESCAPE_BYTES)) - {0}
        mask = bytes(1 if b in alphabet else 0 for b in range(256))
        return _Plan(tuple(enc), tuple(renc), re.compile(pattern.encode()), mask)
    return _Plan(tuple(vals), tuple(runs), re.compile(pattern))


def _whole(data: AnyStr, plan: _Plan, first: bool) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for v in plan.whole:
        i = data.find(v)
        while i >= 0:
            found.append((i, i + len(v)))
            if first:
                return found
            i = data.find(v, i + len(v))
    return found


_STRETCH = b"\1" * RUN


def _windows(data: AnyStr, plan: _Plan) -> list[tuple[int, int]]:
    """Stretches of `data` that can hold a run: made only of bytes a run's spellings are written with.
    One C-speed translate (those bytes to 1, all others to 0) and a search for RUN ones in a row:
    most text has no such stretch, and the search skips RUN bytes at every 0."""
    if plan.mask is None or not plan.runs:
        return [(0, len(data))] if plan.runs else []
    marked = data.translate(plan.mask)
    out: list[tuple[int, int]] = []
    i = marked.find(_STRETCH)
    while i >= 0:
        start = marked.rfind(b"\0", 0, i) + 1
        end = marked.find(b"\0", i)
        end = len(data) if end < 0 else end
        out.append((start, end))
        if len(out) > _MAX_WINDOWS:
            return [(0, len(data))]
        i = marked.find(_STRETCH, end)
    return out


def _extend(data: AnyStr, s: AnyStr, p: int, off: int, width: int, w0: int, w1: int) -> tuple[int, int]:
    """The longest stretch of data[w0:w1] around data[p:p+width] == s[off:off+width] that is
    still a substring of the secret s: the match grown left and right while both agree."""
    lo, hi, a, b = p, p + width, off, off + width
    while lo > w0 and a > 0 and data[lo - 1] == s[a - 1]:
        lo, a = lo - 1, a - 1
    while hi < w1 and b < len(s) and data[hi] == s[b]:
        hi, b = hi + 1, b + 1
    return lo, hi


def _runs(data: AnyStr, plan: _Plan, w0: int, w1: int, first: bool) -> list[tuple[int, int]]:
    """Runs of RUN or more characters of a secret within data[w0:w1]."""
    found: list[tuple[int, int]] = []
    for s in plan.runs:
        for off in range(0, len(s) - _BLOCK + 1, _BLOCK):
            block = s[off:off + _BLOCK]
            p = data.find(block, w0, w1)
            while p >= 0:
                lo, hi = _extend(data, s, p, off, _BLOCK, w0, w1)
                if hi - lo >= RUN:
                    found.append((lo, hi))
                    if first:
                        return found
                    p = data.find(block, hi, w1)
                else:
                    p = data.find(block, p + 1, w1)
    return found


_LONG = 4096  # a stretch this long (a base64 image) is searched by 8-byte grams, vectorized
_GRAM = 8


def _runs_long(data: bytes, plan: _Plan, w0: int, w1: int, first: bool) -> list[tuple[int, int]]:
    """`_runs` for a long stretch: every run of RUN holds an 8-byte block aligned to the stretch
    (a multiple of 8 lies within any 13 consecutive offsets), so the stretch is read as 8-byte
    integers, those equal to some 8-gram of a secret are found at once (numpy), and only they are
    extended; the stretch's last bytes, which fill no whole block, are searched as before."""
    import numpy as np

    grams = _grams(plan.runs)
    count = (w1 - w0) // _GRAM
    blocks = np.frombuffer(data, dtype="<u8", count=count, offset=w0)
    found: list[tuple[int, int]] = []
    for i in np.flatnonzero(np.isin(blocks, np.fromiter(grams, dtype="<u8", count=len(grams)))):
        p = w0 + int(i) * _GRAM
        for s, off in grams[int(blocks[i])]:
            lo, hi = _extend(data, s, p, off, _GRAM, w0, w1)
            if hi - lo >= RUN:
                found.append((lo, hi))
                if first:
                    return found
    tail = w0 + count * _GRAM
    return found + _runs(data, plan, max(w0, tail - 2 * RUN), w1, first)


@lru_cache(maxsize=64)
def _grams(runs: tuple[bytes, ...]) -> dict[int, list[tuple[bytes, int]]]:
    """Each 8-byte substring of the secrets, as a little-endian integer, and where it occurs."""
    out: dict[int, list[tuple[bytes, int]]] = {}
    for s in runs:
        for off in range(len(s) - _GRAM + 1):
            out.setdefault(int.from_bytes(s[off:off + _GRAM], "little"), []).append((s, off))
    return out


def _unescape(data: AnyStr, plan: _Plan) -> tuple[AnyStr, list[int], list[int], list[int]] | None:
    """`data` with its escapes undone, and for each piece (a literal stretch or one escape) where it
    starts in the result and in `data`, and its length in `data` (-1 for a literal)."""
    if isinstance(data, bytes):
        if b"\\" not in data and b"%" not in data:
            return None
    elif "\\" not in data and "%" not in data:
        return None
    out: list[AnyStr] = []
    dec: list[int] = []
    raw: list[int] = []
    esc: list[int] = []
    pos = size = 0
    for m in plan.escapes.finditer(data):
        if m.start() > pos:
            dec.append(size)
            raw.append(pos)
            esc.append(-1)
            out.append(data[pos:m.start()])
            size += m.start() - pos
        ch = _decode(m.group())
        dec.append(size)
        raw.append(m.start())
        esc.append(m.end() - m.start())
        out.append(ch)
        size += len(ch)
        pos = m.end()
    if not esc:
        return None
    dec.append(size)
    raw.append(pos)
    esc.append(-1)
    out.append(data[pos:])
    return data[:0].join(out), dec, raw, esc


def _decode(token: AnyStr) -> AnyStr:
    if isinstance(token, bytes):
        if token[:2] == b"\\u":
            return chr(int(token[2:], 16)).encode("utf-8", "surrogatepass")
        if token[:1] == b"%":
            return bytes([int(token[1:], 16)])
        return token[1:]
    if token[:2] == "\\u":
        return chr(int(token[2:], 16))
    if token[:1] == "%":
        return chr(int(token[1:], 16))
    return token[1:]


def _to_raw(i: int, end: bool, dec: list[int], raw: list[int], esc: list[int]) -> int:
    k = bisect_right(dec, i - 1 if end else i) - 1
    if esc[k] < 0:
        return raw[k] + (i - dec[k])
    return raw[k] + (esc[k] if end else 0)


def spans(data: AnyStr, values: Iterable[str], first: bool = False) -> list[tuple[int, int]]:
    """Merged (start, end) of every place in `data` a secret value or a run of one is written
    (`first`: stop at the first)."""
    vals = tuple(values)
    if not vals or not data:
        return []
    plan = _plan(vals, isinstance(data, bytes))
    found = _whole(data, plan, first)
    if found and first:
        return found
    for w0, w1 in _windows(data, plan):
        found += (_runs_long if isinstance(data, bytes) and w1 - w0 >= _LONG else _runs)(data, plan, w0, w1, first)
        if found and first:
            return found
        undone = _unescape(data[w0:w1], plan)
        if undone is not None:  # the same stretch with its escapes undone, spans mapped back
            text, dec, raw, esc = undone
            found += [(w0 + _to_raw(a, False, dec, raw, esc), w0 + _to_raw(b, True, dec, raw, esc))
                      for a, b in _whole(text, plan, first) + _runs(text, plan, 0, len(text), first)]
            if found and first:
                return found
    return _merge(found)


def _merge(found: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(found):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def contains(data: AnyStr, values: Iterable[str]) -> bool:
    return bool(spans(data, values, first=True))


def cut(data: AnyStr, found: list[tuple[int, int]]) -> AnyStr:
    """`data` with each span replaced by the redaction mark."""
    if not found:
        return data
    mark = REDACTED.encode() if isinstance(data, bytes) else REDACTED
    out, pos = [], 0
    for a, b in found:
        out += [data[pos:a], mark]
        pos = b
    out.append(data[pos:])
    return data[:0].join(out)


def erase(data: AnyStr, values: Iterable[str]) -> AnyStr:
    """`data` (bytes or text) with every secret value, and every run of one, replaced by the mark."""
    return cut(data, spans(data, values))
