"""Streams: capture chunk by chunk while forwarding, and replay with the same chunk boundaries.

Recording: mitmproxy hands every piece of a streamed body to a callable before sending it on;
`ChunkCapture` keeps the bytes (with their time offsets when asked) and returns them unchanged, so
the client gets the first chunk as soon as the upstream sends it.

Each chunk's time offset is kept only when asked (`timed`, `--record-timing`): without it the
log holds the chunk sizes alone (an offset of None).

Replaying: `stream_pieces` cuts a recorded body back into exactly the recorded chunks, with their
due times when the recorded gaps are to be imposed; mitmproxy's own HTTP layer sends them
(`compat.stream_answer`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from noisefloor.proxy import providers


def is_stream(headers: Sequence[tuple[str, str]]) -> bool:
    """SSE, or a chunked body of unknown length: forward as it arrives."""
    h = {k.lower(): v.lower() for k, v in headers}
    if h.get("content-type", "").startswith("text/event-stream"):
        return True
    return "chunked" in h.get("transfer-encoding", "") and "content-length" not in h



def delivered_terminal_event(body: bytes) -> bool:
    """Whether a stream got as far as its provider's closing event: a client that hangs up after
    it (openai-python does) received the whole answer."""
    tail = body[-4096:]
    return any(marker in tail for marker in providers.terminal_events())  # each provider declares its own


@dataclass
class ChunkCapture:
    """The stream callable for record/passthrough mode."""

    started: float = field(default_factory=time.monotonic)
    chunks: list[bytes] = field(default_factory=list)
    offsets_ms: list[float | None] = field(default_factory=list)  # None each: not `timed`
    complete: bool = False
    last_activity: float = field(default_factory=time.monotonic)
    limit: int | None = None  # bytes kept at most (--max-body-mb): past it the chunks are dropped, still forwarded
    size: int = 0  # bytes seen, kept or not
    timed: bool = False  # keep each chunk's offset from the start (--record-timing)

    def __call__(self, data: bytes) -> bytes:
        now = time.monotonic()
        self.last_activity = now
        if data:
            self.size += len(data)
            if self.limit is not None and self.size > self.limit:
                self.chunks.clear()  # an answer no reader would take is not held either
                self.offsets_ms.clear()
            else:
                self.chunks.append(data)
                self.offsets_ms.append(round((now - self.started) * 1000, 3) if self.timed else None)
        else:
            self.complete = True
        return data

    @property
    def over_limit(self) -> bool:
        return self.limit is not None and self.size > self.limit

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def stream_pieces(body: bytes, layout: Sequence[tuple[float | None, int]], timed: bool
                  ) -> tuple[list[bytes], list[float] | None]:
    """A recorded stream cut into its recorded chunks, and (`timed`) each chunk's due time in
    seconds from the head; None: all at once. Bytes past the recorded sizes (never expected) go
    out as one more chunk, at the last chunk's time."""
    chunks, due, pos = [], [], 0
    for offset, length in layout:
        chunks.append(body[pos:pos + length])
        due.append((offset or 0.0) / 1000)
        pos += length
    if pos < len(body):
        chunks.append(body[pos:])
        due.append(due[-1] if due else 0.0)
    return chunks, due if timed else None
