"""The floors' checks on a study: a frozen instance list, no served-model change within an
endpoint, and what the matched design excluded, each as one line."""

from __future__ import annotations

from collections.abc import Sequence

from noisefloor.analyzer.audit import EndpointAudit
from noisefloor.outcome_rows import OutcomeError


def check_study_set(audits: Sequence[EndpointAudit], expected: str | None) -> None:
    """Refuse an endpoint whose matched instance list is not the frozen one."""
    for a in audits:
        if expected and a.study_set != expected:
            raise OutcomeError(f"endpoint {a.endpoint!r}: the study set changed (sha256 {a.study_set[:16]}..., "
                               f"expected {expected[:16]}...); compare only runs on the frozen instance list")


def drift_messages(audits: Sequence[EndpointAudit]) -> list[str]:
    """One line per endpoint whose served model changed within the study (the version-drift guard)."""
    return [f"endpoint {a.endpoint!r} changed served model within the study ({', '.join(a.models)})"
            for a in audits if a.drift]


def excluded_messages(audits: Sequence[EndpointAudit]) -> list[str]:
    return [f"endpoint {a.endpoint!r}: {len(a.excluded)} instance(s) excluded from the matched design and from the "
            f"ladder section alike ({', '.join(f'{i}: {why}' for i, why in a.excluded[:5])}"
            f"{', ...' if len(a.excluded) > 5 else ''})" for a in audits if a.excluded]
