"""What the proxy log adds to an analysis: per-condition call, miss and token counts, and the
served model / fingerprint identities (a model that changed mid-study is a different condition).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from noisefloor.analyzer.head_counts import HeadCounts
from noisefloor.outcome_rows import new_rows
from noisefloor.proxy.store.heads import Parts
from noisefloor.proxy.store.log import Store


def summarize(heads: Iterable[Parts]) -> dict[str, Any]:
    """Per condition: counts and identities, from heads with their sets (`Walk.head_parts`),
    counted per distinct (labels, route), which a session's heads share, and folded into conditions."""
    counts = HeadCounts()
    counts.add_parts(heads)
    return {"conditions": _conditions(counts)}


def _conditions(counts: HeadCounts) -> dict[str, dict[str, Any]]:
    """Each condition's document; labels are (session, task, replicate, condition), a route (mode,
    method, URL, model, fingerprint, replay result)."""
    return {cond: {"exchanges": c[0], "sessions": sessions, "misses": c[1], "order_violations": c[2],
                   "errors": c[3], "truncated": c[4], "input_tokens": c[5], "output_tokens": c[6],
                   "models": sorted(models), "fingerprints": sorted(fingerprints), "modes": sorted(modes)}
            for cond, (c, sessions, modes, models, fingerprints) in counts.by_condition().items()}


def from_store(path: Path | Sequence[Path]) -> dict[str, Any]:
    """The summary of one store, or of several read as one (shards of a study, not yet merged)."""
    paths = [path] if isinstance(path, Path | str) else list(path)
    rules: list[Any] = []
    counts = HeadCounts()  # memory grows with sessions (groups), not exchanges
    for p in paths:
        with Store.open(p, write=False) as store:
            rules.append(store.meta("rules_id"))
            labels, routes = store.walk.head_sets()
            for stored, parts in store.walk.stored_head_batches(labels, routes):
                counts.add(stored, labels, routes)
                counts.add_parts(parts)
            counts.end_store(labels, routes)
    doc: dict[str, Any] = {"conditions": _conditions(counts)}
    doc["store"] = ", ".join(map(str, paths))
    doc["rules_id"] = rules[0] if len(set(rules)) == 1 else sorted({str(r) for r in rules})
    return doc


def outcome_rows(paths: Sequence[Path]) -> list[Mapping[str, Any]]:
    """The graded rows kept in several stores; one (condition, task, replicate) graded differently
    in two of them is refused (a clash of shards, not something to average)."""
    seen: dict[tuple[Any, Any, Any], tuple[Mapping[str, Any], str]] = {}
    rows: list[Mapping[str, Any]] = []
    for p in paths:
        with Store.open(p, write=False) as store:
            rows += new_rows(seen, store.outcome_rows(), str(p))
    return rows


STUDY_META = "nfladder_study"  # written by nfladder: its design, provenance manifest, judge parse counts, truth


def study(paths: Sequence[Path]) -> dict[str, Any] | None:
    """What nfladder kept about its study in the (first) store, None when it kept nothing."""
    for p in paths:
        with Store.open(p, write=False) as store:
            doc = store.meta(STUDY_META)
        if isinstance(doc, dict):
            return doc
    return None


def trajectory_steps(paths: Sequence[Path]) -> list[Any]:
    """Every exchange of the stores as a `trajectories.Step`, sessions of different stores kept
    apart by the store's position."""
    steps = []
    for i, p in enumerate(paths):
        with Store.open(p, write=False) as store:
            steps += steps_of(store, "" if len(paths) == 1 else f"{i}:")
    return steps


def steps_of(store: Store, prefix: str = "") -> list[Any]:
    """An open store's exchanges as `trajectories.Step`s (each answer's body read once, for the
    tool calls it asks for)."""
    from noisefloor.analyzer.trajectories import Step, tools_in
    from noisefloor.verifier.candidates import response_json

    steps = []
    for ex in store.exchanges():
        usage = ex.usage if isinstance(ex.usage, dict) else {}
        try:
            doc = response_json(store, ex)
        except (ValueError, TypeError, KeyError):
            doc = None  # an answer that is not JSON asks for no tool
        replay = ex.replay or {}
        steps.append(Step(ex.id, prefix + ex.session, ex.mode, ex.model, tools_in(doc), _int(usage.get("input")),
                          _int(usage.get("output")), ex.latency_ms, replay.get("result"), _int(replay.get("source_id"))))
    return steps


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None
