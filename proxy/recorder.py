"""Record mode: key each request on arrival, write the exchange when its answer is complete."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.keys import Rules, sha256_hex
from proxy.profiles import extract_meta
from proxy.store import RecordedEntry, Store
from proxy.traffic import Counters, Labels, Prepared, RequestData, ResponseData, Stats, base_record, prepare


class Recorder:
    def __init__(self, store: Store, rules: Rules) -> None:
        store.bind_rules(rules.id, rules.describe())
        self.store = store
        self.rules = rules
        self.stats = Stats()
        self.counters = Counters()
        self.counters.seed((e.session, e.key, e.occurrence, e.seq) for e in store.recorded_entries())

    def begin(self, request: RequestData, labels: Labels) -> Prepared:
        return prepare(request, labels, self.rules, self.counters)

    def finish(
        self,
        p: Prepared,
        response: ResponseData | None,
        *,
        error: str | None = None,
        latency_ms: float | None = None,
        notes: Sequence[str] = (),
    ) -> int:
        """Write the exchange: a response, a connection error, or a stream that broke off (both)."""
        record = base_record(p, "record", self.rules.id)
        record["notes"] += list(notes)
        canonical_text = p.canonical.text.encode()
        canonical_digest = sha256_hex(canonical_text)
        bodies = {canonical_digest: canonical_text, p.request.stored_digest: p.request.stored_body}
        record["latency_ms"] = latency_ms
        record["error"] = error
        if response is not None:
            response = response.without(p.request.secret_values)
            record["response"] = response.record()
            bodies[response.digest] = response.raw_body
            meta = extract_meta(response.decoded_body, response.header("content-type"))
            record.update(
                model=meta.model,
                fingerprint=meta.fingerprint,
                usage={"input": meta.input_tokens, "output": meta.output_tokens},
                finish_reason=meta.finish_reason,
                truncated=meta.truncated,
            )
            if response.status >= 400:
                self.stats.upstream_errors[response.status] = self.stats.upstream_errors.get(response.status, 0) + 1
        else:
            record["response"] = None
        if error is not None:
            self.stats.errors += 1
        entry = RecordedEntry(
            id=0,
            key=p.key,
            session=p.labels.session,
            occurrence=p.occurrence,
            seq=p.seq,
            route=f"{p.canonical.method} {p.canonical.host} {p.canonical.path}",
            canonical=canonical_digest,
        )
        exchange_id = self.store.append(record, bodies, entry)
        self.stats.exchanges += 1
        return exchange_id
