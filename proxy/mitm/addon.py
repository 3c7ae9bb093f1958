"""The mitmproxy side: small hook classes, one job each, added in the order mitmproxy should call
them. This module holds those every mode uses (body limits, labels, rewrites, streams, safety
nets); record and replay have their own (`record_hook.py`, `replay_hook.py`); translating
flows to plain data is `_flows.py`.

Kept thin on purpose: every decision lives in `recorder.py`, `replayer.py`, `keys.py`,
`overrides.py`, `perturb.py` and `sse.py`, which are tested without a proxy.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

from noisefloor.proxy import providers
from noisefloor.proxy._stats import Stats
from noisefloor.proxy.mitm import compat as mitm
from noisefloor.proxy.mitm._flows import (
    CAPTURE,
    DECODED,
    LABELS,
    STALLED,
    STAMP,
    decoded_body,
    error_response,
    label_field,
    log,
    where,
)
from noisefloor.proxy.mitm.compat import ServerHook, http  # mitmproxy's public flow types
from noisefloor.proxy.record.sse import ChunkCapture, is_stream
from noisefloor.proxy.request import decoding, perturb
from noisefloor.proxy.request import overrides as ov
from noisefloor.proxy.request.labels import LABEL_HEADERS, Labels, split_label_prefix
from noisefloor.proxy.request.perturb import Rewrite


class Group:
    """nfproxy's addons as one entry of mitmproxy's addon chain.

    mitmproxy offers each flow event to every chain entry through its own coroutine and error
    guard, but only looks up the hook on an entry's children; grouping keeps the small one-job
    classes without paying that per class and per event.
    """

    def __init__(self, *children: object) -> None:
        self.addons = list(children)


class BodyLimit:
    """Undoes each request body's Content-Encoding with a cap on the decoded size, in a worker
    thread, before anything is keyed or forwarded: a body over the cap (a decompression bomb, or
    just too large) gets 413 and never reaches the provider, and other clients are not held up
    while a large body decodes. The decoded bytes ride along for keying."""

    def __init__(self, limit: int, stats: Stats) -> None:
        self.limit = limit
        self.stats = stats

    async def request(self, flow: http.HTTPFlow) -> None:
        raw = flow.request.raw_content or b""
        encoding = flow.request.headers.get("content-encoding")
        if not encoding and len(raw) <= self.limit:
            return
        try:
            flow.metadata[DECODED] = await asyncio.to_thread(decoding.decode, raw, encoding, self.limit)
        except decoding.BodyTooLarge as exc:
            self.stats.errors += 1
            log.error("nfproxy: refused %s: %s", where(flow), exc)
            flow.response = error_response(413, "nfproxy_body_too_large", str(exc), {"x-nf-refused": "body-too-large"})
        except Exception:  # noqa: BLE001 - not what it claims to be: keyed on its raw bytes, with a note
            pass


class SessionLabels:
    """Reads the x-nf-* labels and strips them, so they reach neither the provider nor the key."""

    def __init__(self, defaults: Labels) -> None:
        self.defaults = defaults

    def request(self, flow: http.HTTPFlow) -> None:
        headers = flow.request.headers
        # the raw fields, scanned once: Headers.items() looks every name up again (quadratic)
        found = {k: v for k, v in (label_field(f) for f in headers.fields if f[0][:5].lower() == b"x-nf-")
                 if k in LABEL_HEADERS}
        for h in found:
            del headers[h]
        from_path, path = split_label_prefix(flow.request.path)
        if from_path:
            flow.request.path = path
            found.update(from_path)
        flow.metadata[LABELS] = self.defaults.overlay(found) if found else self.defaults


class BodyRewrites:
    """Rewrites JSON request bodies before they are keyed and forwarded: `--set` overrides, then a
    `--perturb` variant of the last user message. Both are stamped on the exchange."""

    def __init__(self, overrides: Sequence[ov.Override], perturbation: tuple[str, Rewrite] | None = None,
                 profile: str | None = None) -> None:
        self.overrides = list(overrides)
        self.perturbation = perturbation
        self.profile = profile  # a forced provider; None: by host and path, as keying picks it

    def request(self, flow: http.HTTPFlow) -> None:
        if not (self.overrides or self.perturbation) or not flow.request.raw_content or flow.response is not None:
            return
        stamp = dict(flow.metadata.get(STAMP, {}))
        notes = list(stamp.get("notes", ()))
        try:
            doc = json.loads(decoded_body(flow))
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            notes.append("request body is not a JSON object: --set/--perturb not applied")
        else:
            if self.overrides:
                doc = ov.apply(doc, self.overrides)
                stamp["overrides"] = ov.describe(self.overrides)
            if self.perturbation:
                name, rewrite = self.perturbation
                provider = providers.pick(self.profile, flow.request.host, flow.request.path)
                changed = perturb.apply(doc, rewrite, provider)
                if changed is None:
                    notes.append(f"no user message to perturb: {name} not applied")
                else:
                    doc = changed
                    stamp["perturbation"] = name
            content = json.dumps(doc).encode()
            flow.request.content = content  # re-encoded as the client sent it
            flow.metadata[DECODED] = content
        if notes:
            stamp["notes"] = notes
        flow.metadata[STAMP] = stamp


class Streams:
    """Forwards streamed responses as they arrive; with a recorder, captures their chunks (and,
    `timed`, each chunk's offset from the start).

    A stream that stalls for longer than `timeout` seconds has its upstream connection closed, so
    the client sees the stream end and the log gets an error exchange instead of a hung request.
    """

    def __init__(self, timeout: float, capture: bool, limit: int | None = None, timed: bool = False) -> None:
        self.timeout = timeout
        self.capture = capture
        self.timed = timed
        self.limit = limit  # bytes a capture keeps at most (--max-body-mb)
        self._watchers: set[asyncio.Task[None]] = set()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        if not is_stream(tuple(flow.response.headers.items(multi=True))):
            return
        capture = ChunkCapture(limit=self.limit if self.capture else None, timed=self.capture and self.timed)
        flow.response.stream = capture
        if self.capture:
            flow.metadata[CAPTURE] = capture
        task = asyncio.get_running_loop().create_task(self._watch(flow, capture))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, flow: http.HTTPFlow, capture: ChunkCapture) -> None:
        while not capture.complete and flow.live:
            idle = time.monotonic() - capture.last_activity
            if idle >= self.timeout:
                flow.metadata[STALLED] = f"upstream stalled: no stream data for {self.timeout:g} s"
                log.warning("nfproxy: %s for %s", flow.metadata[STALLED], where(flow))
                mitm.close_server_connection(flow, "upstream stalled")
                return
            await asyncio.sleep(min(1.0, self.timeout - idle))


class NoUpstream:
    """Replay's safety net: refuses every upstream connection. Replay answers in the request hook
    (streams too), so this never fires unless something went wrong before an answer was set; then
    the client gets an error, not a live answer."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def server_connect(self, data: ServerHook) -> None:
        data.server.error = "nfproxy replay never connects upstream"
        self.stats.errors += 1
        log.error("nfproxy: refused an upstream connection to %s in replay mode", data.server.address)


class TlsFailures:
    """Counts clients that refused nfproxy's certificate, so the summary can say how to fix it."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def tls_failed_client(self, data: object) -> None:
        self.stats.tls_failures += 1
