"""Where nfanalyze's rows come from: outcome files, the graded rows an nfproxy log keeps (with its
per-condition counts and what nfladder kept about its study), inspect_ai logs, or the built-in
example. I/O at the edge: files in, rows and plain dicts out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from noisefloor.analyzer.analyze_options import AnalyzeOptions
from noisefloor.analyzer.outcome_columns import RowColumns
from noisefloor.errors import InputError
from noisefloor.outcome_rows import OutcomeRow, key_of, parse_rows, read_rows


@dataclass(frozen=True)
class Inputs:
    rows: list[OutcomeRow] | RowColumns  # columns: a store's rows read straight into them (`stored_rows`);
    # empty only when stores alone were given and hold no graded rows (nfanalyze shows their trajectories)
    log: dict[str, Any] | None = None  # the logs' per-condition counts
    kept: dict[str, Any] | None = None  # what nfladder kept about its study in the log


def gather(o: AnalyzeOptions) -> Inputs:
    """Every row the options name. A log's own rows count where --outcomes does not give the same
    (condition, task, replicate): a file passed beside a log corrects it."""
    log_doc = kept = None
    logged: list[Any] = []
    where = ", ".join(map(str, o.logs))
    if o.logs:
        from noisefloor.analyzer import logstats

        log_doc = logstats.from_store(list(o.logs))  # a damaged store: one line, from the command's handling
        columns = _columns(o)
        logged = logstats.outcome_rows(list(o.logs)) if columns is None else []
        kept = logstats.study(list(o.logs))
        if columns is not None:
            return Inputs(columns, log_doc, kept)  # none: the caller shows the stores' trajectories
    if not o.outcomes and not o.example and not o.inspect_specs and not logged:
        if o.logs:
            return Inputs([], log_doc, kept)
        raise _no_rows(where)
    if o.outcomes and not o.logs:
        columns = _file_columns(o)
        if columns is not None:
            return Inputs(columns)
    if o.example:
        from noisefloor.analyzer.simulate import example

        return Inputs(list(example().rows), log_doc, kept)
    rows = parse_rows(read_rows(o.outcomes), str(o.outcomes)) if o.outcomes else []
    if logged:
        given = {key_of(r) for r in rows}
        mine = parse_rows(enumerate(logged, 1), f"outcome rows in {where}")
        rows += [r for r in mine if key_of(r) not in given]
    for spec in o.inspect_specs:
        from noisefloor.analyzer import inspect_logs

        rows += parse_rows(inspect_logs.rows(spec, o.inspect_pass_at), spec)
    return Inputs(rows, log_doc, kept)


def _no_rows(where: str) -> InputError:
    return InputError(f"{where} holds exchanges but no graded outcome rows; grade them with "
                      f"`nfverify SUITE {where}` (which keeps the rows in the log) or pass --outcomes FILE")


def _file_columns(o: AnalyzeOptions) -> RowColumns | None:
    """An outcomes file's rows as columns when it is the only source and the ladder is all it
    feeds (no floors, no gate); None when the rows are to be read the full way."""
    if o.example or o.inspect_specs or o.floors or o.outcomes is None:
        return None
    from noisefloor.analyzer import file_rows
    from noisefloor.analyzer.gate import GATE_CONDITIONS

    columns = file_rows.read(o.outcomes)
    if columns is None or set(GATE_CONDITIONS) <= set(columns.conditions):
        return None
    return columns


def _columns(o: AnalyzeOptions) -> RowColumns | None:
    """The stores' rows as columns when they are the only rows and the ladder is all they feed (no
    floors, no gate: those read typed rows); None when the rows are to be read the full way."""
    if o.outcomes or o.example or o.inspect_specs or o.floors:
        return None
    from noisefloor.analyzer import stored_rows
    from noisefloor.analyzer.gate import GATE_CONDITIONS

    columns = stored_rows.read(list(o.logs))
    if columns is None or set(GATE_CONDITIONS) <= set(columns.conditions):
        return None
    return columns
