"""One gate run from three outcome files, as `nfanalyze gate` and `noisefloor.gate` both do it:
the stamp checks first (a score without its stamp is not comparable to anything), then the
verdicts and the operating characteristics; and the run's renderings for CI (JUnit XML, Markdown
for a step summary, JSON).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from noisefloor.analyzer import gate as g
from noisefloor.analyzer.gate_input import load_run
from noisefloor.errors import InputError

VERDICTS = ("within_noise", "inconclusive", "regressed", "quarantine")


class StampError(InputError):
    """The runs are unstamped or their stamps differ (the CLI's exit 2)."""


@dataclass(frozen=True)
class GateResult:
    """The verdicts of one gate run.

    stamp: the runs' common stamp (model, sampling, grader, case ids), hashed.
    verdicts: one `CaseVerdict` per case (case_id, verdict, the three counts, floor, p-values).
    counts: how many cases got each verdict.
    operating_characteristics: what the gate risks for an unchanged model.
    settings: the `GateSettings` used.
    """

    stamp: str | None
    verdicts: tuple[g.CaseVerdict, ...]
    counts: dict[str, int]
    operating_characteristics: g.OperatingCharacteristics
    settings: g.GateSettings

    @property
    def regressed(self) -> bool:
        """A case regressed: the CLI exits 1."""
        return self.counts.get("regressed", 0) > 0

    def to_json(self) -> dict[str, Any]:
        return {"stamp": self.stamp, "verdicts": [asdict(v) for v in self.verdicts], "counts": dict(self.counts),
                "operating_characteristics": asdict(self.operating_characteristics), "settings": asdict(self.settings)}


def check_stamps(paths: tuple[Path, Path, Path], runs: list[g.GateRun], allow_unstamped: bool) -> None:
    unstamped = [f"{p.name} ({r.missing})" for p, r in zip(paths, runs) if r.missing]
    if unstamped and not allow_unstamped:
        raise StampError("refusing to compare unstamped runs: " + "; ".join(unstamped) + ". A score without its "
                         "stamp (model, sampling, grader_version) is not comparable to anything; add the fields "
                         "to the rows, or pass --allow-unstamped")
    if len({r.stamp for r in runs}) != 1:
        parts = [f"{p.name}: {r.description}" for p, r in zip(paths, runs)]
        raise StampError("refusing to compare runs with different stamps (model, sampling, grader, cases): "
                         + "; ".join(parts))


def run_counts(a: Mapping[str, g.CaseCounts], b: Mapping[str, g.CaseCounts], c: Mapping[str, g.CaseCounts],
               settings: g.GateSettings, target_false_block: float = 0.05, stamp: str | None = None) -> GateResult:
    verdicts = tuple(g.gate(a, b, c, settings))
    oc = g.operating_characteristics(a, b, c, settings, target_false_block)
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    return GateResult(stamp, verdicts, counts, oc, settings)


def run_files(base_a: str | os.PathLike[str], base_b: str | os.PathLike[str], candidate: str | os.PathLike[str],
              settings: g.GateSettings | None = None, *, condition: str | None = None,
              allow_unstamped: bool = False, target_false_block: float = 0.05) -> GateResult:
    settings = settings or g.GateSettings()
    paths = (Path(base_a), Path(base_b), Path(candidate))
    runs = [load_run(p, condition) for p in paths]
    check_stamps(paths, runs, allow_unstamped)
    return run_counts(runs[0].counts, runs[1].counts, runs[2].counts, settings, target_false_block, runs[0].stamp)


# -- renderings for CI -------------------------------------------------------------------------


# C0 / C1 controls (ESC starts terminal and OSC sequences), surrogates, the noncharacters XML 1.0
# forbids, and the bidirectional overrides that make text read differently from what it holds
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """A case id as inert text: each control or unencodable character spelled as a `\\xNN` /
    `\\uNNNN` escape, so XML stays well-formed and no escape sequence reaches a terminal."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}",
                            str(text))


def _line(v: g.CaseVerdict) -> str:
    return (f"{v.verdict}: baseline {v.base_a.passes}/{v.base_a.n}, {v.base_b.passes}/{v.base_b.n}; "
            f"candidate {v.candidate.passes}/{v.candidate.n}; floor {v.floor:.3f}")


def junit_xml(result: GateResult, name: str = "nfanalyze gate") -> bytes:
    """One test case per case: a regression is a failure, a quarantined case is skipped."""
    suite = ET.Element("testsuite", name=name, tests=str(len(result.verdicts)),
                       failures=str(result.counts.get("regressed", 0)), errors="0",
                       skipped=str(result.counts.get("quarantine", 0)))
    for v in result.verdicts:
        case_id = printable(v.case_id)
        case = ET.SubElement(suite, "testcase", classname="nfanalyze.gate", name=case_id)
        if v.verdict == "regressed":
            ET.SubElement(case, "failure", message=f"{case_id} regressed", type="regressed").text = _line(v)
        elif v.verdict == "quarantine":
            ET.SubElement(case, "skipped", message=f"{case_id} quarantined: its baselines disagree")
        ET.SubElement(case, "system-out").text = _line(v)
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


_MD_PUNCT = re.compile(r"[\\`*_{}\[\]()#+!|~:-]")


def _md(text: str) -> str:
    """A case id in a Markdown table cell, inert: no pipe, tag, entity, code span, link, emphasis
    or control character; each Markdown punctuation mark backslash-escaped."""
    text = printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCT.sub(lambda m: "\\" + m[0], text)


def markdown(result: GateResult) -> str:
    """A summary for a CI step (GitHub's $GITHUB_STEP_SUMMARY): the counts, then the cases, worst first."""
    order = {"regressed": 0, "quarantine": 1, "inconclusive": 2, "within_noise": 3}
    oc = result.operating_characteristics
    risk = {r.case_id: r for r in oc.cases}
    head = "regressed" if result.regressed else "passed"
    lines = [f"## nfanalyze gate: {head}", "",
             ", ".join(f"{n} {k}" for k, n in result.counts.items()) + f" (stamp `{result.stamp}`)" if result.stamp
             else ", ".join(f"{n} {k}" for k, n in result.counts.items()), "",
             "| case | verdict | baseline A | baseline B | candidate | floor | P(regressed if unchanged) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for v in sorted(result.verdicts, key=lambda v: (order.get(v.verdict, 9), v.case_id)):
        lines.append(f"| {_md(v.case_id)} | {v.verdict} | {v.base_a.passes}/{v.base_a.n} | {v.base_b.passes}/{v.base_b.n} "
                     f"| {v.candidate.passes}/{v.candidate.n} | {v.floor:.3f} | {risk[v.case_id].false_regressed:.3f} |")
    lines += ["", f"An unchanged suite blocks with probability {oc.suite_false_block:.3f} "
                  f"({oc.suite_false_block_escalated:.3f} with inconclusive cases re-run)."]
    return "\n".join(lines) + "\n"


# -- the gate of a study's three collections (nfladder's gate design, `nfanalyze LOG`) ---------------


@dataclass(frozen=True)
class GateSection:
    """The gate's part of a report, from three runs' rows: refused (with why), or one `GateResult`."""

    names: tuple[str, str, str]
    runs: tuple[g.GateRun, g.GateRun, g.GateRun]
    settings: g.GateSettings
    refused: str | None
    result: GateResult | None

    @property
    def verdicts(self) -> tuple[g.CaseVerdict, ...]:
        return self.result.verdicts if self.result else ()

    @property
    def oc(self) -> g.OperatingCharacteristics | None:
        return self.result.operating_characteristics if self.result else None

    @property
    def escalated(self) -> list[str]:
        """Cases whose candidate ran more repeats than baseline A: re-run after an inconclusive call."""
        a, c = self.runs[0].counts, self.runs[2].counts
        return sorted(k for k in c if k in a and c[k].n > a[k].n)

    def counts(self) -> dict[str, int]:
        return dict(self.result.counts) if self.result else {k: 0 for k in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"conditions": list(self.names), "refused": self.refused, "escalated": self.escalated,
                               "stamps": {n: r.description for n, r in zip(self.names, self.runs)}}
        return doc | (self.result.to_json() if self.result else {"counts": self.counts(), "verdicts": []})


def section(runs: list[g.GateRun], names: tuple[str, str, str] = g.GATE_CONDITIONS,
            settings: g.GateSettings | None = None, target_false_block: float = 0.05) -> GateSection:
    """Refuse unstamped runs or differing stamps (seed 004), else the verdicts and operating characteristics."""
    s = settings or g.GateSettings()
    runs3 = (runs[0], runs[1], runs[2])
    try:
        check_stamps(tuple(Path(n) for n in names), list(runs3), allow_unstamped=False)  # type: ignore[arg-type]
    except StampError as exc:
        return GateSection(names, runs3, s, str(exc), None)
    a, b, c = (r.counts for r in runs3)
    return GateSection(names, runs3, s, None, run_counts(a, b, c, s, target_false_block, runs3[0].stamp))
