"""Record mode: key each request on arrival, write the exchange when its answer is complete."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noisefloor.proxy import exchange_record, secrets
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.profiles import extract_meta
from noisefloor.proxy.store import RecordedEntry, Store
from noisefloor.proxy.traffic import Counters, Labels, Prepared, RequestData, ResponseData, Stats, prepare


@dataclass(frozen=True)
class Pending:
    """A keyed request waiting for its answer, with the request's half of the exchange record
    already serialized: begun while the upstream works, so that finishing, which the client waits
    for, only handles the response."""

    prepared: Prepared
    request_json: str  # the request's record fields, a JSON object without "notes"
    notes: list[str]


class Recorder:
    def __init__(self, store: Store, rules: Rules) -> None:
        store.bind_rules(rules.id, rules.describe())
        self.store = store
        self.rules = rules
        self.stats = Stats()
        self.counters = Counters()
        self.counters.seed((e.session, e.key, e.occurrence, e.seq) for e in store.recorded_entries())

    def begin(self, request: RequestData, labels: Labels) -> Pending:
        """Key the request; call in arrival order (occurrence numbers follow it)."""
        p = prepare(request, labels, self.rules, self.counters)
        record = exchange_record.request_part(p, "record", self.rules.id)
        notes = record.pop("notes")
        return Pending(p, json.dumps(record), notes)

    def finish(
        self,
        pending: Pending,
        response: ResponseData | None,
        *,
        error: str | None = None,
        latency_ms: float | None = None,
        notes: Sequence[str] = (),
        end: float | None = None,
    ) -> int:
        """Write the exchange: a response, a connection error, or a stream that broke off (both)."""
        p = pending.prepared
        if error is not None:  # an upstream's status line or message may carry the key it was sent
            error = secrets.erase_text(error, p.request.secret_values)
        # the answer is complete: a request arriving after this may depend on it (an import gives the
        # recorded time)
        end = time.time() if end is None else end
        record: dict[str, Any] = {"end": end, "latency_ms": latency_ms, "error": error,
                                  "notes": pending.notes + list(notes)}
        # a body already stored (a replicate asking the same again) is not compressed again
        bodies = {p.request.stored_digest: p.request.stored_body}
        identity = None
        if response is not None:
            response = response.without(p.request.secret_values)
            bodies[response.digest] = response.raw_body
            meta = extract_meta(response.decoded_body, response.header("content-type"))
            identity = {"model": meta.model, "fingerprint": meta.fingerprint,
                        "usage": {"input": meta.input_tokens, "output": meta.output_tokens},
                        "finish_reason": meta.finish_reason, "truncated": meta.truncated}
            if response.status >= 400:
                self.stats.upstream_errors[response.status] = self.stats.upstream_errors.get(response.status, 0) + 1
        record.update(exchange_record.answer_part(response, identity))
        if error is not None:
            self.stats.errors += 1
        entry = RecordedEntry(
            id=0,
            key=p.key,
            session=p.labels.session,
            occurrence=p.occurrence,
            seq=p.seq,
            route=f"{p.canonical.method} {p.canonical.host} {p.canonical.path}",
            start=p.started,
            end=end,
        )
        exchange_id = self.store.append(exchange_record.join(pending.request_json, record), bodies, entry)
        self.stats.exchanges += 1
        return exchange_id
