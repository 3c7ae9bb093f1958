"""The floors section of a report, built from the audits' data: JSON, terminal text and Markdown
all come from the same `Line` trees that each registered statistic gives for its result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from noisefloor.analyzer.audit import EndpointAudit
from noisefloor.analyzer.floors import Line, registered
from noisefloor.analyzer.floors.registry import plain
from noisefloor.display import md, visible

TITLE = "Rerun and perturbation floors"


def to_json(audits: Sequence[EndpointAudit]) -> dict[str, Any]:
    out = {}
    for a in audits:
        doc: dict[str, Any] = {"study_set": a.study_set, "instances": a.instances,
                               "excluded": [{"instance": i, "reason": why} for i, why in a.excluded]}
        for s in registered():
            r = a.results.get(s.key)
            doc[s.key] = None if r is None else (s.to_json or plain)(r)
        out[a.endpoint] = doc | {"models": list(a.models), "drift": a.drift}
    return out


def sections(audits: Sequence[EndpointAudit]) -> list[Line]:
    """One line per endpoint, with every registered statistic's lines under it."""
    out = []
    for a in audits:
        drift = f"; DRIFT: served models {', '.join(map(visible, a.models))}" if a.drift else ""
        body = [line for s in registered() if a.results.get(s.key) is not None for line in s.lines(a.results[s.key])]
        out.append(Line(f"{visible(a.endpoint)}: {a.instances} matched instances (study set {a.study_set[:12]}), "
                        f"{len(a.excluded)} excluded{drift}", tuple(body)))
    return out


def _text(lines: Sequence[Line], depth: int) -> list[str]:
    return [row for line in lines for row in ["  " * depth + line.text, *_text(line.children, depth + 1)]]


def _bullets(lines: Sequence[Line], depth: int) -> list[str]:
    return [row for line in lines for row in ["  " * depth + "- " + md(line.text), *_bullets(line.children, depth + 1)]]


def text_lines(audits: Sequence[EndpointAudit]) -> list[str]:
    """The floors as indented terminal lines, one per quantity with its 95% interval."""
    return _text(sections(audits), 0)


def table(audits: Sequence[EndpointAudit]) -> str:
    return "\n".join([f"{TITLE} (matched instances; 95% intervals):", *_text(sections(audits), 1)])


def markdown(audits: Sequence[EndpointAudit], title: str = TITLE) -> list[str]:
    """The floors as a Markdown section: a heading, then nested bullets from the same lines."""
    return [f"## {title}", "", "Matched instances; 95% intervals in brackets.", "", *_bullets(sections(audits), 0)]
