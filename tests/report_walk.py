"""Every estimate a report prints beside its interval, found in the report's JSON and its text,
so a test can check that no estimate lies outside its own interval.

JSON conventions the reports use (each a sibling of the interval in one object):
- `X_ci` beside `X` (score, w, budget, disagreement, ...); `variable_tasks_ci` is the interval
  of the share `variable_tasks / tasks`;
- `ci` beside `estimate` (contrasts) or `mean` (curve points) or `mean_correlation` (dependence);
- `ci` as a mapping from field name to interval beside those fields (floors results, pass^k).
Intervals are [low, high] lists whose ends may be "Infinity" / "-Infinity"; null is undefined.

Text: every `number [low, high]` (or `(`/`)` at an infinite end) on a line, numbers as printed
(a `%` on the estimate and not on the ends is read as a share), and `k/n [low, high]`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

TOL = 1e-9


@dataclass(frozen=True)
class Pair:
    where: str
    estimate: float
    low: float
    high: float
    slack: float = TOL  # printed text: what rounding to its digits may move an estimate or an end

    @property
    def inside(self) -> bool:
        return self.low - self.slack <= self.estimate <= self.high + self.slack


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if x in ("Infinity", "-Infinity"):
        return float(x)
    return None


def _interval(x: Any) -> tuple[float, float] | None:
    if isinstance(x, list) and len(x) == 2:
        lo, hi = _num(x[0]), _num(x[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


ESTIMATE_KEYS = ("estimate", "mean", "mean_correlation")


def json_pairs(doc: Any, where: str = "") -> Iterator[Pair]:
    """Every (estimate, interval) pair in a report's JSON document."""
    if isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from json_pairs(v, f"{where}[{i}]")
        return
    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        path = f"{where}/{key}"
        if key.endswith("_ci") and key != "ci" and (ci := _interval(value)) is not None:
            base = key[:-3]
            est = _num(doc.get(base, doc.get(f"{base}_share")))  # malformed_ci: the malformed share's
            if base == "variable_tasks" and est is not None and _num(doc.get("tasks")):
                est = est / float(doc["tasks"])
            if base == "w" and "measured_w" in doc:  # the known-truth block
                est = _num(doc["measured_w"])
            if est is not None:
                yield Pair(path, est, *ci)
        elif key == "ci" and (ci := _interval(value)) is not None:
            for name in ESTIMATE_KEYS:
                est = _num(doc.get(name))
                if est is not None:
                    yield Pair(path, est, *ci)
                    break
        elif key == "ci" and isinstance(value, dict):
            for name, iv in value.items():
                ci, est = _interval(iv), _num(doc.get(name))
                if ci is not None and est is not None:
                    yield Pair(f"{path}/{name}", est, *ci)
        yield from json_pairs(value, path)


_END = r"(-?inf|[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(%?)"
_TEXT = re.compile(r"(?<![\w./])([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(%?)(?:x)? [\[(]" + _END + ", " + _END + r"[\])]")
_FRACTION = re.compile(r"(?<![\w.])(\d+)/(\d+) [\[(]" + _END + ", " + _END + r"[\])]")


def _value(text: str, percent: str) -> float:
    x = float(text)
    return x / 100 if percent else x


def _half_unit(text: str, percent: str) -> float:
    """Half the last printed digit's unit (on the fraction scale when printed in percent)."""
    if "inf" in text:
        return 0.0
    digits = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    return 0.5 * 10.0**-digits / (100 if percent else 1)


def text_pairs(text: str) -> Iterator[Pair]:
    """Every `estimate [low, high]` and `k/n [low, high]` the text prints."""
    for lineno, line in enumerate(text.replace("\\", "").splitlines(), 1):
        for m in _TEXT.finditer(line):
            est = _value(m[1], m[2])
            slack = _half_unit(m[1], m[2]) + max(_half_unit(m[3], m[4]), _half_unit(m[5], m[6])) + TOL
            yield Pair(f"line {lineno}: {m[0]}", est, _value(m[3], m[4]), _value(m[5], m[6]), slack)
        for m in _FRACTION.finditer(line):
            k, n = int(m[1]), int(m[2])
            if n:
                slack = max(_half_unit(m[3], m[4]), _half_unit(m[5], m[6])) + TOL
                yield Pair(f"line {lineno}: {m[0]}", k / n, _value(m[3], m[4]), _value(m[5], m[6]), slack)
