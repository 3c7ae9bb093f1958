"""A recorded request's body compressed ahead, while the upstream works on it, so that the write
the client waits for only looks the value up.

What a body is stored as depends on three things besides its bytes: whether it is stored already,
the previous exchange of its session it is compressed against (the chain link, `store.py`), and
the body dictionary in use. `ahead` computes the value against the link and dictionary of now;
`taken` gives it to the write only if the write's link is that same object and its dictionary the
same, else the write compresses it as before. Either way the stored bytes are those the write
would have made: the value is a function of those three and the bytes (which the digest names).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from noisefloor.proxy import codec

CHAIN_DEPTH = 6  # a request is compressed against its session's previous exchange at most this deep
_KEPT = 256  # values computed ahead and not yet written (a request whose answer never came is dropped)


class AheadBodies:
    """Request bodies compressed ahead of their write (a part of Store)."""

    _env: Any
    _bodies: Any
    _codec: codec.Codec
    _keys: dict[str, bytes]
    _chains: OrderedDict[str, tuple[bytes, bytes, bytes, bytes, int]]
    _reading: Any
    _ahead: OrderedDict[str, tuple[Any, bytes | None, bytes]]  # body sha256 -> (link, dictionary, value)
    writable: bool

    def ahead(self, session: str, hexdigest: str, data: bytes) -> None:
        """Compress a request body the session's next write will store, now (a body stored already,
        or empty, is left alone: the write skips it). Never fails: it only saves the write work."""
        if not data or not self.writable:
            return
        link = self._chains.get(session)
        key = self._keys.get("body") or None
        try:
            with self._reading("bodies"), self._env.begin(db=self._bodies, buffers=True) as txn:
                if txn.get(bytes.fromhex(hexdigest)) is not None:
                    return
            value = self.encoded(data, link, key)
        except Exception:  # noqa: BLE001 - the write does it again, and reports what fails where it fails
            return
        self._ahead[hexdigest] = (link, key, value)
        self._ahead.move_to_end(hexdigest)
        if len(self._ahead) > _KEPT:
            self._ahead.popitem(last=False)

    def taken(self, hexdigest: str, link: tuple[bytes, bytes, bytes, bytes, int] | None, key: bytes | None,
              data: bytes) -> bytes:
        """The stored value of a request body written against `link` with dictionary `key`: the
        one computed ahead where it was computed against the same, else computed now."""
        got = self._ahead.pop(hexdigest, None)
        if got is not None and got[0] is link and got[1] == key:
            return got[2]
        return self.encoded(data, link, key)

    def encoded(self, data: bytes, link: tuple[bytes, bytes, bytes, bytes, int] | None, key: bytes | None) -> bytes:
        """A request body's value: against its session's previous request and answer while the
        chain is short enough, else with the body dictionary."""
        if link is not None and link[4] < CHAIN_DEPTH:
            # most of a request is the previous request and answer of its session
            return self._codec.encode_against(data, [(link[0], link[1]), (link[2], link[3])])
        return self._codec.encode(data, key)
