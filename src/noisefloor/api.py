"""The one-call Python surface (`noisefloor.analyze`, `noisefloor.load_outcomes`, `noisefloor.gate`):
what the commands do, as functions that take `str` or path-like names and return result objects
with documented attributes and `to_json()`. The gate makes the CLI's stamp checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noisefloor.analyzer.analysis import Analysis, Settings
    from noisefloor.analyzer.gate import CaseCounts, GateSettings
    from noisefloor.analyzer.gate_run import GateResult
    from noisefloor.analyzer.outcomes import OutcomeSet
    from noisefloor.proxy.store.log import Store

PathLike = str | os.PathLike[str]


def _is_store(p: Path) -> bool:
    return p.is_dir() and (p / "data.mdb").is_file()


def _rows(source: Any) -> list[Any]:
    """Outcome rows (typed) from a file, a store, a Store, or several stores."""
    from noisefloor.analyzer import logstats
    from noisefloor.outcome_rows import OutcomeError, parse_rows, read_rows
    from noisefloor.proxy.store.log import Store

    if isinstance(source, Store):
        return parse_rows(enumerate(source.outcome_rows(), 1), f"outcome rows in {source.path}")
    if isinstance(source, str | os.PathLike):
        p = Path(source)
        if _is_store(p):
            return parse_rows(enumerate(logstats.outcome_rows([p]), 1), f"outcome rows in {p}")
        if not p.is_file():
            raise OutcomeError(f"{p} is neither an outcome file (.jsonl / .csv) nor an nfproxy store")
        return parse_rows(read_rows(p), str(p))
    if isinstance(source, Sequence):
        paths = [Path(s) for s in source]
        if all(_is_store(p) for p in paths):
            return parse_rows(enumerate(logstats.outcome_rows(paths), 1), ", ".join(map(str, paths)))
        return [row for s in source for row in _rows(s)]
    raise TypeError(f"cannot read outcome rows from {type(source).__name__}; give a path, a Store or an OutcomeSet")


def open_store(path: PathLike, *, write: bool = False) -> Store:
    """The nfproxy store at `path` (a folder with data.mdb), read-only unless `write`; use it as a
    context manager (`with noisefloor.open_store("nf-demo/log.lmdb") as store:`). Its exchanges are
    `store.exchanges()`, one by id `store.exchange(n)`, its outcome rows `store.outcome_rows()`;
    every value is verified as it is read. A missing or damaged store raises `StoreError` naming it."""
    from noisefloor.proxy.store.log import Store

    return Store.open(path, write=write)


def load_outcomes(source: PathLike | Store | Sequence[PathLike], *, missing_tasks: str = "intersect",
                  unbalanced: str = "trim") -> OutcomeSet:
    """Outcome rows from a JSON Lines / CSV file or the graded rows kept in a store (or several),
    grouped into aligned matrices (`OutcomeSet`: tasks, conditions, dropped_tasks, warnings, rows)."""
    from noisefloor.analyzer.outcomes import build

    return build(_rows(source), missing_tasks=missing_tasks, unbalanced=unbalanced)


def analyze(source: OutcomeSet | PathLike | Store | Sequence[PathLike], settings: Settings | None = None,
            progress: Callable[[int, int], None] | None = None, *, resamples: int | None = None,
            seed: int | None = None, contrasts: Sequence[tuple[str, str]] = (), delta: float | None = None,
            alpha: float | None = None, power: float | None = None, missing_tasks: str = "intersect",
            unbalanced: str = "trim") -> Analysis:
    """The determinism ladder of `source` (an outcome file, a store, a `Store`, several stores, or
    an `OutcomeSet`), as `nfanalyze` computes it; keywords as its options (`resamples` is
    --bootstrap). Returns an `Analysis`: `conditions` (each with
    `name`, `stats` (tasks, replicates, score, w, variable_tasks, budget, mde), `w_ci`, `score_ci`,
    `budget_ci`), `contrasts`, `judge`, `warnings`; `condition(name)`; `to_json()`."""
    from dataclasses import replace

    from noisefloor.analyzer.analysis import Settings
    from noisefloor.analyzer.analysis import analyze as run
    from noisefloor.analyzer.outcomes import OutcomeSet

    data = source if isinstance(source, OutcomeSet) else load_outcomes(source, missing_tasks=missing_tasks,
                                                                       unbalanced=unbalanced)
    s = settings or Settings()
    if resamples is not None:
        s = replace(s, resamples=resamples)
    if seed is not None:
        s = replace(s, seed=seed)
    if contrasts:
        s = replace(s, contrasts=tuple((a, b) for a, b in contrasts))
    planned = {k: v for k, v in (("delta", delta), ("alpha", alpha), ("power", power)) if v is not None}
    if planned:  # the rerun budget's effect size and error rates, as --delta / --alpha / --power
        s = replace(s, plan=replace(s.plan, **planned))
    return run(data, s, progress)


Counts = Mapping[str, "CaseCounts | tuple[int, int]"]


def _counts(run: Counts) -> dict[str, CaseCounts]:
    from noisefloor.analyzer.gate import CaseCounts

    return {str(k): v if isinstance(v, CaseCounts) else CaseCounts(int(v[0]), int(v[1])) for k, v in run.items()}


def gate(base_a: PathLike | Counts, base_b: PathLike | Counts, candidate: PathLike | Counts,
         settings: GateSettings | None = None, *, condition: str | None = None, allow_unstamped: bool = False,
         target_false_block: float = 0.05) -> GateResult:
    """Per-case regression verdicts, as `nfanalyze gate` gives them.

    Three outcome files (paths): their stamps must be present and equal, else `StampError`
    (`allow_unstamped=True` skips the presence check). Or three mappings case id -> `CaseCounts`
    (or `(passes, n)`), which carry no stamp to check. Returns a `GateResult`: `verdicts`,
    `counts`, `regressed`, `operating_characteristics`, `stamp`, `to_json()`.
    """
    from noisefloor.analyzer import gate_run
    from noisefloor.analyzer.gate import GateSettings

    s = settings or GateSettings()
    runs = (base_a, base_b, candidate)
    if all(isinstance(r, str | os.PathLike) for r in runs):
        return gate_run.run_files(base_a, base_b, candidate, s, condition=condition,  # type: ignore[arg-type]
                                  allow_unstamped=allow_unstamped, target_false_block=target_false_block)
    if all(isinstance(r, Mapping) for r in runs):
        a, b, c = (_counts(r) for r in runs)  # type: ignore[arg-type]
        if not set(a) == set(b) == set(c):
            from noisefloor.analyzer.gate_run import StampError

            raise StampError("the three runs hold different cases; gate the same cases in each")
        return gate_run.run_counts(a, b, c, s, target_false_block)
    raise TypeError("give gate() three outcome files, or three mappings of case id to CaseCounts")
