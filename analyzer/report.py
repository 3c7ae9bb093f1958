"""Rendering an Analysis: terminal table, Markdown, JSON document and the ladder plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noisefloor import outputs
from noisefloor.analyzer.analysis import Analysis
from noisefloor.analyzer.intervals import fmt_ci
from noisefloor.analyzer.ladder import TASK_BOOTSTRAP
from noisefloor.display import md, visible

Escape = Callable[[object], str]  # how an outside label is shown: `visible` (terminal) or `md` (Markdown)


def _ci(ci: tuple[float, float] | list[float] | None, digits: int = 5) -> str:
    if ci is None:
        return "[no interval: one task]"
    return fmt_ci((float(ci[0]), float(ci[1])), f".{digits}f")


def _mark(method: str) -> str:
    """A w interval not made by the task bootstrap alone is marked; its note says how."""
    return "" if method in (TASK_BOOTSTRAP, "undefined") else " *"  # "!" lines below the table flag known coverage shortfalls


def _exact(j: object) -> str:
    return " exact binomial: the bootstrap is degenerate" if getattr(j, "disagreement_ci_method", "") == "clopper_pearson" else ""


def _method_lines(a: Analysis, esc: Escape = visible) -> list[str]:
    """How every interval not from the plain task bootstrap was made (the * in the table)."""
    out = [f"* {esc(c.name)}: {esc(c.w_interval.note)}" for c in a.conditions
           if c.w_interval.method != TASK_BOOTSTRAP and c.w_ci is not None]
    out += [f"* {esc(c.a)} - {esc(c.b)}: {esc(c.note)}" for c in a.contrasts
            if c.method not in (TASK_BOOTSTRAP, "undefined")]
    out += [f"# {esc(c.name)}: {c.stats.tasks}x{c.stats.replicates} keeps the first {c.stats.replicates} replicates of "
            f"each task (its tasks had {c.trimmed_from[0]} to {c.trimmed_from[1]})" for c in a.conditions if c.trimmed_from]
    out += [f"! {esc(c.name)}: {esc(c.w_interval.flag)}" for c in a.conditions if c.w_interval.flag]
    return out


def _rows(a: Analysis, esc: Escape = visible) -> list[list[str]]:
    rows = []
    for c in a.conditions:
        s = c.stats
        rows.append(
            [
                esc(c.name),
                f"{s.tasks}x{s.replicates}" + (" #" if c.trimmed_from else ""),
                f"{s.score:.4f}",
                f"{s.w:.5f} {_ci(c.w_ci)}{_mark(c.w_interval.method) if c.w_ci is not None else ''}",
                f"{s.variable_tasks}/{s.tasks} {_ci(s.variable_tasks_ci, 3)}",
                f"{s.budget} " + (f"[{c.budget_ci[0]}, {c.budget_ci[1]}]" if c.budget_ci is not None else _ci(None)),
                f"{s.mde:.4f}",
            ]
        )
    return rows


HEADER = ["condition", "N x R", "score", "w [95% CI; * not bootstrap alone]", "variable tasks [CP 95%]", "budget R* [CI]", "MDE"]


def table(a: Analysis, log: dict[str, Any] | None = None) -> str:
    """Plain-text report for a terminal."""
    rows = [HEADER, *_rows(a)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    fmt = lambda r: "  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip()  # noqa: E731
    p = a.settings.plan
    out = [
        f"Determinism ladder: {len(a.tasks)} tasks, {a.settings.resamples} joint task-bootstrap resamples "
        f"(seed {a.settings.seed}); budget for delta={p.delta}, alpha={p.alpha}, power={p.power}",
        "",
        fmt(rows[0]),
        fmt(["-" * w for w in widths]),
        *(fmt(r) for r in rows[1:]),
    ]
    out += [f"  {line}" for line in _method_lines(a)]
    if a.contrasts:
        out += ["", "Contrasts of w (A - B, not truncated):"]
        out += [f"  {visible(c.a)} - {visible(c.b)}: {c.estimate:+.5f} {_ci(c.ci)}{_mark(c.method)}"
                for c in a.contrasts]
    if a.batches:
        b = a.batches
        out += ["", f"Batches {visible(b.a)} - {visible(b.b)}: {b.estimate:+.5f} {_ci(b.ci)}"]
    carriers = _carrier_lines(a)
    if carriers:
        out += ["", "Largest single-task share of w (w without it):", *(f"  {line}" for line in carriers)]
    for name, j in a.judge.items():
        conf = f", mean confidence {j.mean_confidence:.3f}" if j.mean_confidence is not None else ""
        out += [
            "",
            f"Judge {visible(name)}: majority disagrees with the reference on {j.disagreements}/{j.tasks} tasks "
            f"({j.disagreement:.1%} {_ci(j.disagreement_ci, 3)}{_exact(j)}): {j.false_accepts} false accepts, "
            f"{j.false_rejects} false rejects, {j.ties} ties{conf}",
        ]
    if log:
        out += ["", "Proxy log per condition:", *(f"  {line}" for line in _log_lines(log))]
    out += [f"warning: {visible(w)}" for w in a.warnings]
    return "\n".join(out)


def _carrier_lines(a: Analysis, esc: Escape = visible) -> list[str]:
    return [f"{esc(c.name)}: {esc(x.task)} carries {x.share:.0%} (w -> {x.w_without:.5f})"
            for c in a.conditions if c.carriers for x in c.carriers[:1]]


def _log_lines(log: dict[str, Any], esc: Escape = visible) -> list[str]:
    return [f"{esc(cond)}: {s['exchanges']} calls, {s['misses']} misses, {s['order_violations']} order violations, "
            f"{s['errors']} errors, {s['truncated']} truncated, {_tokens(s)}, "
            f"models {', '.join(map(esc, s['models'])) or '-'}" for cond, s in log["conditions"].items()]


def _tokens(s: dict[str, Any]) -> str:
    """Token counts as the answers reported them; answers that reported none are not 0 tokens."""
    if s["exchanges"] and not s["input_tokens"] and not s["output_tokens"]:
        return "tokens not reported by the answers"
    return f"tokens in/out {s['input_tokens']}/{s['output_tokens']}"


def truth_line(truth: dict[str, Any], esc: Escape = visible) -> str:
    """The built-in provider's known w beside the measured one (nfladder demo)."""
    return ("Known truth (built-in provider): " + ", ".join(
        f"{esc(c)} w={v['true_w']:.5f} " + ({True: "inside its interval", False: "OUTSIDE its interval"}
                                              .get(v["covered"], "(no interval)")) for c, v in truth["w"].items())
        + f"; ladder order live > t0 > replay: {'holds' if truth['order_holds'] else 'DOES NOT HOLD'}")


def markdown(a: Analysis, log: dict[str, Any] | None = None, floors: list[str] | None = None,
             truth: dict[str, Any] | None = None, heading: str = "# Determinism ladder") -> str:
    """The terminal's report as Markdown. `floors`: the floors section as Markdown lines
    (`floors_report.markdown`), when the rows carry endpoints; `truth`: the known w of the built-in provider (nfladder);
    `heading`: the ladder's heading (a design's report puts the ladder below its own section)."""
    head = "| " + " | ".join(HEADER) + " |"
    sep = "|" + "---|" * len(HEADER)
    body = ["| " + " | ".join(r) + " |" for r in _rows(a, md)]
    out = [heading, "", head, sep, *body, ""]
    notes = _method_lines(a, md)
    if notes:
        out += [f"- {line[2:]}" if line[0] in "*#" else f"- coverage warning: {line[2:]}" for line in notes] + [""]
    if a.contrasts:
        out += ["## Contrasts", "", "| A - B | estimate | 95% CI |", "|---|---|---|"]
        out += [f"| {md(c.a)} - {md(c.b)} | {c.estimate:+.5f} | {_ci(c.ci)}{_mark(c.method)} |" for c in a.contrasts]
        out.append("")
    if truth:
        out += ["## Known truth", "", truth_line(truth, md), ""]
    carriers = _carrier_lines(a, md)
    if carriers:
        out += ["## Largest single-task share of w", "", *(f"- {line}" for line in carriers), ""]
    for name, j in a.judge.items():
        out += [f"## Judge {md(name)}", "",
                f"Majority verdict disagrees with the reference on {j.disagreements}/{j.tasks} tasks "
                f"({j.disagreement:.1%}, 95% CI {_ci(j.disagreement_ci, 3)}{_exact(j)}); {j.false_accepts} false accepts, "
                f"{j.false_rejects} false rejects.", ""]
    if log:
        out += ["## Proxy log per condition", "", *(f"- {line}" for line in _log_lines(log, md)), ""]
    if floors:
        out += [*floors, ""]
    p = a.settings.plan
    out.append(
        f"Settings: {a.settings.resamples} joint task-bootstrap resamples, seed {a.settings.seed}; "
        f"delta={p.delta}, alpha={p.alpha}, power={p.power}."
    )
    out += [f"\n> warning: {md(w)}" for w in a.warnings]
    return "\n".join(out) + "\n"


def write_json(doc: dict[str, Any], path: str) -> None:
    """The JSON report to stdout ('-') or, atomically, to a file (labels kept as they are: JSON escapes them)."""
    text = json.dumps(doc, indent=2, sort_keys=False)
    if path == "-":
        print(text)
    else:
        outputs.write_text(path, text + "\n")


LABEL_CHARS = 24  # a longer condition name is cut with an ellipsis on the plot (the tables show it whole)


def _label(name: str) -> str:
    shown = visible(name)
    shown = shown if len(shown) <= LABEL_CHARS else shown[:LABEL_CHARS - 1] + "\u2026"
    return shown.replace("$", r"\$")  # no mathtext from a label


def figure(a: Analysis, truth: dict[str, Any] | None = None) -> Any:
    """The ladder figure: w per condition with its interval, and the rerun budgets, side by side.
    Laid out by matplotlib's constrained layout, tick labels stood upright when they would touch, so no
    text overlaps another or leaves the figure (tests measure it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [_label(c.name) for c in a.conditions]
    w = [c.stats.w for c in a.conditions]
    lo = [c.stats.w - c.w_ci[0] if c.w_ci is not None else 0.0 for c in a.conditions]
    hi = [c.w_ci[1] - c.stats.w if c.w_ci is not None else 0.0 for c in a.conditions]
    budgets = [c.stats.budget for c in a.conditions]
    b_lo = [c.stats.budget - c.budget_ci[0] if c.budget_ci is not None else 0 for c in a.conditions]
    b_hi = [c.budget_ci[1] - c.stats.budget if c.budget_ci is not None else 0 for c in a.conditions]
    colors = plt.cm.viridis([i / max(1, len(names) - 1) * 0.85 for i in range(len(names))])
    x = list(range(len(names)))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(9, 1.3 * len(names) + 5), 4.8), layout="constrained")
    ax1.bar(x, w, yerr=[lo, hi], capsize=6, color=colors, edgecolor="black", linewidth=0.8)
    for i, v in enumerate(w):
        ax1.annotate(f"{v:.4f}", (i, v), textcoords="offset points", xytext=(9, 3), fontsize=8)
        if v == 0:  # a zero bar has no height: mark it so it is seen, not missed
            ax1.plot([i - 0.4, i + 0.4], [0, 0], color=colors[i], linewidth=4, solid_capstyle="butt")
    known = (truth or {}).get("w", {})
    marks = [(i, known[c.name]["true_w"]) for i, c in enumerate(a.conditions) if c.name in known]
    if marks:
        ax1.scatter([i for i, _ in marks], [t for _, t in marks], marker="D", s=40, color="crimson", zorder=5,
                    label="known truth")
        fig.legend(loc="outside lower center", fontsize=8, frameon=False)  # below the axes: over no bar
    ax1.set_ylabel("within-task variance w")
    ax1.set_title("Noise floor w per condition (95% interval)", fontsize=11)
    ax1.set_ylim(bottom=0, top=max([v + h for v, h in zip(w, hi)] + [1e-6]) * 1.12)
    ax2.bar(x, budgets, yerr=[b_lo, b_hi], capsize=6, color=colors, edgecolor="black", linewidth=0.8)
    for i, v in enumerate(budgets):
        ax2.annotate(str(v), (i, v), textcoords="offset points", xytext=(9, 3), fontsize=8)
    p = a.settings.plan
    ax2.set_ylabel("reruns per arm R*")
    ax2.set_title(f"Rerun budget to see a {p.delta:g} difference (power {p.power:g})", fontsize=11)
    ax2.set_ylim(bottom=0, top=max([v + h for v, h in zip(budgets, b_hi)] + [1]) * 1.12)
    for ax in (ax1, ax2):
        ax.set_xticks(x, names)
    fig.suptitle(f"{len(a.tasks)} tasks; intervals from {a.settings.resamples} joint task-bootstrap resamples "
                 f"(an exact bound where few tasks varied)", fontsize=9)
    if _ticks_touch(fig, (ax1, ax2)):
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", labelrotation=90)
        fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + 1.5)  # room for the upright names
    return fig


def _ticks_touch(fig: Any, axes: Any) -> bool:
    """Whether neighbouring condition names on an axis would overlap when drawn flat."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    for ax in axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        if any(b1.x1 + 4 > b2.x0 for b1, b2 in zip(boxes, boxes[1:])):
            return True
    return False


def plot(a: Analysis, path: Path, truth: dict[str, Any] | None = None) -> None:
    """The ladder figure as a PNG, written atomically."""
    import matplotlib.pyplot as plt

    fig = figure(a, truth)
    with outputs.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
