"""How a statistic joins the floors report: it registers itself here, and the report (terminal,
JSON, Markdown) shows every registered statistic for every endpoint, in `order`.

A statistic is a pure function of one endpoint's matched arms (`Arms`) and the settings, plus
how its result reads: as JSON (by default its dataclass fields, intervals as [low, high]) and as
report lines. A module in this package that calls `register` at import is picked up by the
package itself, so adding a statistic touches its own module and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, Resampled
from noisefloor.analyzer.intervals import Interval, fmt_ci, fmt_num, jsonable
from noisefloor.errors import InputError


@dataclass(frozen=True)
class Arms:
    """One endpoint's matched arms: the same instances, in the same order, in every matrix."""

    instances: tuple[str, ...]
    main: np.ndarray | None  # instances x runs of the rerun arm; None without two main runs
    variants: Mapping[str, np.ndarray]  # perturbation variant -> instances x runs
    fingerprints: np.ndarray | None  # the main arm's system fingerprint per (instance, run), '' unknown
    failures: tuple[tuple[int, str | None], ...]  # the main arm's (outcome, failure label) per unit


@dataclass(frozen=True)
class FloorSettings:
    resamples: int = DEFAULT_RESAMPLES  # instance-bootstrap draws for every floors interval
    seed: int = 0
    curve_resamples: int | None = None  # per point of the SD-vs-n curve (None: the curve's own default)


@dataclass(frozen=True)
class Line:
    """One report line and the lines under it. `text` is terminal-safe (outside labels went
    through `display.visible`); Markdown escapes it again and nests `children` as sub-bullets."""

    text: str
    children: tuple[Line, ...] = ()


@dataclass(frozen=True)
class Statistic:
    key: str  # the endpoint's JSON key, and the name in `EndpointAudit.results`
    compute: Callable[[Arms, FloorSettings], Any]  # None when the arms cannot carry it
    lines: Callable[[Any], list[Line]]
    order: int  # position in the report, lowest first
    to_json: Callable[[Any], Any] | None = None  # None: `plain`


STATISTICS: dict[str, Statistic] = {}


def register(stat: Statistic) -> Statistic:
    if stat.key in STATISTICS:
        raise InputError(f"floors statistic {stat.key!r} is registered twice; give it its own key")
    STATISTICS[stat.key] = stat
    return stat


def registered() -> list[Statistic]:
    return sorted(STATISTICS.values(), key=lambda s: (s.order, s.key))


def plain(x: Any) -> Any:
    """Dataclasses, intervals and mappings as JSON-ready values (intervals as [low, high]; an
    infinite end as "Infinity", see intervals.py)."""
    if isinstance(x, Interval):
        return x.to_json()
    if is_dataclass(x) and not isinstance(x, type):
        out = {f.name: plain(getattr(x, f.name)) for f in fields(x)}
        extra = getattr(x, "json_extra", None)
        return out | plain(extra()) if callable(extra) else out
    if isinstance(x, Mapping):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float):
        return jsonable(x)
    return x


def number(v: float | None, ci: Interval | None = None, fmt: str = ".4f", why: str | None = None,
           res: Resampled | None = None, method: str | None = None) -> str:
    """A number, its interval (open at inf), and what the reader must know to read them: why it is
    undefined, which share of resamples was undefined (left out) or infinite, how the interval was made."""
    if v is None:
        return f"undefined ({why})" if why else "n/a"
    out = fmt_num(v, fmt) + (f" {fmt_ci(ci, fmt)}" if ci is not None else "")
    notes = []
    if res is not None and res.undefined and ci is None:
        notes.append(f"interval undefined: {res.undefined:.1%} of resamples 0/0")
    elif res is not None and res.undefined:
        notes.append(f"{res.undefined:.1%} of resamples 0/0, left out")
    if res is not None and res.infinite:
        notes.append(f"{res.infinite:.1%} of resamples infinite")
    if method and method not in ("instance_bootstrap", "clopper_pearson", "task_bootstrap"):
        notes.append(method.replace("_", " "))
    return out + (f" ({'; '.join(notes)})" if notes else "")


def field_text(x: Any, k: str, fmt: str = ".4f") -> str:
    """`number` for field `k` of a result with `ci`, `undefined`, `resampled` (and `methods`) maps."""
    return number(getattr(x, k), x.ci.get(k), fmt, x.undefined.get(k), x.resampled.get(k),
                  getattr(x, "methods", {}).get(k))
