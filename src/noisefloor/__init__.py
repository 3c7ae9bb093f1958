"""noisefloor: how much of an eval score is real, and how much is rerun noise.

The four parts install as subpackages of this one name (the repository keeps them as top-level
folders): `noisefloor.proxy` (record / strict replay, the LMDB log), `noisefloor.verifier`
(sandboxed grading), `noisefloor.analyzer` (determinism-ladder statistics) and
`noisefloor.ladder` (runs an agent through every condition). The names below are the surface a
Python user needs; everything else is reachable through the subpackages but may move.

They load on first use: a process that needs one small part (the built-in agent run as a
script, a CLI's --help) must not pay for numpy, scipy and mitmproxy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_SURFACE = {
    "Analysis": "noisefloor.analyzer.analysis",
    "Settings": "noisefloor.analyzer.analysis",
    "Planning": "noisefloor.analyzer.ladder",
    "analyze": "noisefloor.api",
    "CaseCounts": "noisefloor.analyzer.gate",
    "CaseVerdict": "noisefloor.analyzer.gate",
    "GateSettings": "noisefloor.analyzer.gate",
    "GateResult": "noisefloor.analyzer.gate_run",
    "StampError": "noisefloor.analyzer.gate_run",
    "gate": "noisefloor.api",
    "OutcomeError": "noisefloor.outcome_rows",
    "OutcomeSet": "noisefloor.analyzer.outcomes",
    "Row": "noisefloor.analyzer.outcomes",
    "load_outcomes": "noisefloor.api",
    "open_store": "noisefloor.api",
    "build_outcomes": ("noisefloor.analyzer.outcomes", "build"),
    "CanonicalRequest": "noisefloor.proxy.request.keys",
    "Rules": "noisefloor.proxy.request.keys",
    "canonicalize": "noisefloor.proxy.request.keys",
    "Exchange": "noisefloor.proxy.store.exchange",
    "Store": "noisefloor.proxy.store.log",
    "StoreError": "noisefloor.proxy.store.log",
    "GradeOptions": "noisefloor.verifier.grading",
    "code_grader": "noisefloor.verifier.grading",
    "Sandbox": "noisefloor.verifier.sandbox",
    "SandboxError": "noisefloor.verifier.isolation",
}

__all__ = [  # written out so that tools see the names the lazy loader serves
    "Analysis", "CanonicalRequest", "CaseCounts", "CaseVerdict", "Exchange", "GateResult", "GateSettings",
    "GradeOptions", "OutcomeError", "OutcomeSet", "Planning", "Row", "Rules", "Sandbox", "SandboxError", "Settings", "StampError",
    "Store", "StoreError", "__version__", "analyze", "build_outcomes", "canonicalize", "code_grader", "gate",
    "load_outcomes", "open_store",
]


def _version() -> str:
    """The installed distribution's version, looked up on first use: the metadata scan costs each
    agent start (tens of milliseconds) and almost nothing reads it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("noisefloor")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    where = _SURFACE.get(name)
    if where is None:
        raise AttributeError(f"module 'noisefloor' has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from noisefloor.analyzer.analysis import Analysis, Settings
    from noisefloor.analyzer.gate import CaseCounts, CaseVerdict, GateSettings
    from noisefloor.analyzer.gate_run import GateResult, StampError
    from noisefloor.analyzer.ladder import Planning
    from noisefloor.analyzer.outcomes import OutcomeSet, Row
    from noisefloor.analyzer.outcomes import build as build_outcomes
    from noisefloor.api import analyze, gate, load_outcomes, open_store
    from noisefloor.outcome_rows import OutcomeError
    from noisefloor.proxy.request.keys import CanonicalRequest, Rules, canonicalize
    from noisefloor.proxy.store.exchange import Exchange
    from noisefloor.proxy.store.log import Store, StoreError
    from noisefloor.verifier.grading import GradeOptions, code_grader
    from noisefloor.verifier.isolation import SandboxError
    from noisefloor.verifier.sandbox import Sandbox
