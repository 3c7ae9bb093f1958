"""The compressor a session's next request body is stored with, made ahead of that request.

What a body is stored as depends on three things besides its bytes: whether it is stored already,
the previous exchange of its session it is compressed against (the chain link, `store.py`), and
the body dictionary in use. The compressor against a session's last exchange is made once that
exchange is committed and its answer released (`prepare_chain`): the link is known then, the body
it will compress is not, and creating the compressor is most of the work. Whether one was prepared
changes when the work is done, never the bytes.
"""

from __future__ import annotations

from collections import OrderedDict

from noisefloor.proxy.store import _codec as codec

CHAIN_DEPTH = 6  # a request is compressed against its session's previous exchange at most this deep
# compressors made for sessions' next requests (an LRU: one holds a zstd context, ~65 kB for a
# chat turn, ~150 kB at the size bound: 10 MB at most); with more sessions interleaved than this,
# one is evicted before its request comes
_PREPARED = 64
_PREPARED_BYTES = 128 << 10  # a larger link is left to the write: compressing against it costs more than the set-up

Link = tuple[bytes, bytes, bytes, bytes, int]  # a session's last (request sha256, request, answer sha256, answer, depth)


class AheadBodies:
    """Compressors prepared for sessions' next request bodies (a part of Store)."""

    _codec: codec.Codec
    _chains: OrderedDict[str, Link]
    _prepared: OrderedDict[str, tuple[Link, codec.Against]]  # session -> its link and a compressor against it
    writable: bool

    def prepare_chain(self, session: str) -> None:
        """Make the compressor a request of `session` would be compressed with against its last
        exchange, before that request arrives (a proxy calls this once the answer is released).
        Never fails: it only saves the work of a write, which makes its own if none is here."""
        link = self._chains.get(session)
        got = self._prepared.pop(session, None)
        if link is None or link[4] >= CHAIN_DEPTH or not self.writable or len(link[1]) + len(link[3]) > _PREPARED_BYTES:
            return
        if got is not None and got[0] is link:  # its last exchange set no new link: still the one
            self._prepared[session] = got
            return
        try:
            against = codec.Against(_refs(link)).warmed()
        except Exception:  # noqa: BLE001 - the write compresses it, and reports what fails where it fails
            return
        self._prepared[session] = (link, against)
        self._prepared.move_to_end(session)
        if len(self._prepared) > _PREPARED:
            self._prepared.popitem(last=False)

    def encoded(self, data: bytes, link: Link | None, key: bytes | None) -> bytes:
        """A request body's value: against its session's previous request and answer while the
        chain is short enough (with the compressor `prepare_chain` made, if it made one for this
        link), else with the body dictionary."""
        if link is None or link[4] >= CHAIN_DEPTH:
            return self._codec.encode(data, key)
        # most of a request is the previous request and answer of its session
        against = next((a for known, a in self._prepared.values() if known is link), None)
        return (against or codec.Against(_refs(link))).encode(data)


def _refs(link: Link) -> list[tuple[bytes, bytes]]:
    return [(link[0], link[1]), (link[2], link[3])]
