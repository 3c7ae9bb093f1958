"""`nfanalyze analyze`'s options, declared once: `AnalyzeOptions` is what the code reads,
`analyze_options` declares the command line from its defaults (the statistics' own defaults,
`Settings` and `Planning`), and `from_cli` turns what click parsed into it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import options
from noisefloor.analyzer.analysis import Settings
from noisefloor.analyzer.ladder import Planning

_S, _P = Settings(), Planning()


@dataclass(frozen=True)
class AnalyzeOptions:
    logs: tuple[Path, ...] = ()  # nfproxy stores (shards of one study)
    outcomes: Path | None = None
    example: bool = False
    inspect_specs: tuple[str, ...] = ()  # [CONDITION=]PATH
    inspect_pass_at: float | None = None
    json_path: str | None = None  # '-': stdout
    md_path: Path | None = None
    plot_path: Path | None = None
    resamples: int = _S.resamples
    seed: int = _S.seed
    delta: float = _P.delta
    alpha: float = _P.alpha
    power: float = _P.power
    contrasts: tuple[tuple[str, str], ...] = ()
    compare_batches: tuple[str, str] | None = None
    missing_tasks: str = "intersect"
    unbalanced: str = "trim"
    top: int = _S.top_tasks
    progress: bool | None = None  # None: on a terminal
    floors: bool | None = None  # None: when rows carry endpoint or variant
    study_set: str | None = None
    abort_on_drift: bool = True
    quiet: bool = False

    @property
    def has_input(self) -> bool:
        return bool(self.outcomes or self.example or self.logs or self.inspect_specs)

    def settings(self) -> Settings:
        """The analysis' settings (a bad delta / alpha / power is refused by Planning)."""
        return Settings(self.resamples, self.seed, Planning(self.delta, self.alpha, self.power), self.contrasts,
                        self.compare_batches, self.top)


_D = AnalyzeOptions()

analyze_options = options(
    click.argument("logs", nargs=-1, type=click.Path(path_type=Path)),
    click.option("--outcomes", type=click.Path(path_type=Path),
                 help="Outcome rows: .jsonl or .csv (task_id, condition, replicate, outcome)."),
    click.option("--example", is_flag=True, help="Analyze a built-in simulated ladder (live, t0, replay) with known "
                 "truth."),
    click.option("--json", "json_path", metavar="PATH", help="Write the JSON report ('-' for stdout)."),
    click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown report."),
    click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write the ladder plot (PNG)."),
    click.option("--bootstrap", "resamples", default=_D.resamples, show_default=True, type=click.IntRange(min=1)),
    click.option("--seed", default=_D.seed, show_default=True, type=int),
    click.option("--delta", default=_D.delta, show_default=True, type=float,
                 help="Difference the rerun budget must detect."),
    click.option("--alpha", default=_D.alpha, show_default=True, type=float),
    click.option("--power", default=_D.power, show_default=True, type=float),
    click.option("--contrast", "contrasts", multiple=True, metavar="A:B",
                 help="Contrast w_A - w_B; repeatable (default: every pair)."),
    click.option("--compare-batches", nargs=2, metavar="A B",
                 help="Two batches of one condition: w_A - w_B with a joint interval."),
    click.option("--missing-tasks", type=click.Choice(["intersect", "error"]), default=_D.missing_tasks,
                 show_default=True, help="A task absent from some condition: drop it from all (reported), or refuse."),
    click.option("--unbalanced", type=click.Choice(["trim", "error"]), default=_D.unbalanced, show_default=True,
                 help="Unequal replicate counts in a condition: keep the first R_min of each task (reported), or "
                      "refuse."),
    click.option("--top", default=_D.top, show_default=True, type=click.IntRange(min=0),
                 help="Tasks listed as carrying most of w."),
    click.option("--progress/--no-progress", default=None, help="Bootstrap progress bar (default: on a terminal)."),
    click.option("--floors/--no-floors", "floors", default=None,
                 help="Rerun / perturbation floors (default: when rows carry endpoint or variant)."),
    click.option("--study-set", help="Expected sha256 of the sorted instance ids: refuse if the study set changed."),
    click.option("--abort-on-drift/--allow-drift", default=_D.abort_on_drift, show_default=True,
                 help="Exit 4 when an endpoint's served model changed within the study; --allow-drift analyzes "
                      "anyway, with the drift in the warnings."),
    click.option("--inspect-logs", "inspect_specs", multiple=True, metavar="[CONDITION=]PATH",
                 help="inspect_ai eval logs (a .eval/.json file or a folder) as outcome rows: sample id -> task, "
                      "epoch (and run) -> replicate, first scorer -> outcome; repeatable, one per condition "
                      "(default condition: the folder's name)."),
    click.option("--inspect-pass-at", type=float, help="Read numeric inspect scores at or above this as a pass."),
    click.option("-q", "--quiet", is_flag=True, help="No table on stdout."),
)


def from_cli(*, contrasts: tuple[str, ...], compare_batches: tuple[str, str] | None, **same: Any) -> AnalyzeOptions:
    """AnalyzeOptions from `analyze_options`' parameters; a malformed value is a usage error."""
    o = AnalyzeOptions(contrasts=tuple(_pair(c) for c in contrasts),
                       compare_batches=compare_batches or None, **same)
    if not o.has_input:
        raise click.UsageError("give --outcomes FILE (or a LOG, --inspect-logs PATH, or --example)")
    return o


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise click.BadParameter(f"{text!r} is not A:B (two condition names)", param_hint="--contrast")
    return a, b
