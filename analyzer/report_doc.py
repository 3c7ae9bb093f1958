"""report.json, built in one place: nfanalyze and nfladder both hand their parts to `build`, so
a report has the same keys, the same warnings and the same schema whichever command wrote it.

Pure: an Analysis and plain parts in, a JSON-ready dict out. `SCHEMA` is the report's version;
a reader that meets another one knows the layout moved."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from noisefloor.analyzer import audit, audit_checks
from noisefloor.analyzer.analysis import Analysis

SCHEMA = 1  # bump when a key's meaning or layout changes
# what nfladder keeps in the log's meta so that `nfanalyze LOG` reports the study as nfladder did
KEPT = ("design", "served_by_requested", "study_settings", "provenance", "judge_parse", "truth", "compare")


@dataclass(frozen=True)
class Parts:
    """Everything a report holds beyond the analysis; each part is None where a study has none."""

    log: Mapping[str, Any] | None = None  # the proxy log's per-condition counts (logstats)
    design: str | None = None
    served_by_requested: Mapping[str, Sequence[str]] | None = None  # "condition / model asked" -> models served
    study_settings: Mapping[str, Any] | None = None  # the study's own settings, beside the analysis'
    provenance: Mapping[str, Any] | None = None
    judge_parse: Mapping[str, Any] | None = None
    truth: Mapping[str, Any] | None = None  # the built-in provider's known values
    floors: Mapping[str, Any] | None = None
    floor_notes: tuple[str, ...] = ()  # the floors' own warnings (`floor_notes`)
    gate: Mapping[str, Any] | None = None
    compare: Mapping[str, Any] | None = None  # the compare design's coupling verdicts and contrasts

    @classmethod
    def kept(cls, meta: Mapping[str, Any] | None, **parts: Any) -> Parts:
        """Parts from what nfladder kept in a log (`kept_meta`), plus the given ones."""
        return cls(**{k: v for k, v in (meta or {}).items() if k in KEPT}, **parts)

    def kept_meta(self) -> dict[str, Any]:
        """What a log keeps of these parts (the study's, not the log's counts)."""
        return {k: getattr(self, k) for k in KEPT if getattr(self, k) is not None}


def drifted(served_by_requested: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The entries whose one requested model was answered by more than one served model. An agent
    that asks for two models is not drift; one requested model answered by two served ones is."""
    return {k: sorted(v) for k, v in served_by_requested.items() if len(v) > 1}


def drift_warnings(served_by_requested: Mapping[str, Sequence[str]]) -> list[str]:
    return [f"{c}: the served model changed within the study ({', '.join(m)})"
            for c, m in drifted(served_by_requested).items()]


def floor_notes(audits: Sequence[audit.EndpointAudit]) -> tuple[str, ...]:
    """The floors' warnings: an endpoint whose served model changed, instances left out."""
    return (*audit_checks.drift_messages(audits), *audit_checks.excluded_messages(audits))


def build(analysis: Analysis, parts: Parts = Parts()) -> dict[str, Any]:
    """report.json: the analysis, then each part the study has, and every warning in one list."""
    doc: dict[str, Any] = {"schema": SCHEMA, **analysis.to_json()}
    if parts.study_settings:
        doc["settings"] = {**doc["settings"], **parts.study_settings}
    doc["warnings"] = [*doc["warnings"], *drift_warnings(parts.served_by_requested or {}), *parts.floor_notes]
    for key in ("log", "design", "served_by_requested", "provenance", "judge_parse", "truth", "floors", "gate",
                "compare"):
        value = getattr(parts, key)
        if value is not None:
            doc[key] = value
    return doc
