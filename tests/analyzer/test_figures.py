"""Every figure noisefloor draws, checked by rendering it: at the default size no piece of text
(titles, axis and tick labels, value labels, the legend) overlaps another or leaves the figure,
measured with matplotlib's own renderer on the drawn figure."""

from __future__ import annotations

import itertools

import pytest

from noisefloor.analyzer import report
from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.outcomes import Row, build
from noisefloor.analyzer.simulate import example

pytest.importorskip("matplotlib")


def _texts(fig):
    """(what, window box) of every visible, non-empty text in the drawn figure."""
    from matplotlib.text import Text

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip()]


def clashes(fig) -> list[str]:
    """Texts that overlap each other or are cut by the figure's edge."""
    width, height = fig.bbox.width, fig.bbox.height
    texts = _texts(fig)
    out = [f"{what!r} leaves the figure" for what, b in texts
           if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > width + 0.5 or b.y1 > height + 0.5]
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        if ba.overlaps(bb) and ba.width > 0 and bb.width > 0:
            out.append(f"{a!r} overlaps {b!r}")
    return out


def _analysis(names: list[str]):
    rows = list(example(n_tasks=12, replicates=4, seed=3).rows)
    extra = [Row(r.task_id, name, r.replicate, r.outcome) for name in names[3:] for r in rows if r.condition == "live"]
    renamed = {"live": names[0], "t0": names[1], "replay": names[2]}
    rows = [Row(r.task_id, renamed[r.condition], r.replicate, r.outcome) for r in rows] + extra
    return analyze(build(rows), Settings(resamples=200))


def test_the_measure_sees_an_overlap_and_a_cut_title():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 4))
    ax1.set_title("a title long enough to run into its neighbour's title on the right")
    ax2.set_title("the neighbour's title, long enough to be cut by the edge")
    found = clashes(fig)
    plt.close(fig)
    assert any("overlaps" in c for c in found) and any("leaves the figure" in c for c in found), found


@pytest.mark.parametrize("names", [
    ["live", "t0", "replay"],
    ["live", "t0", "replay", "t0-seeded", "replay-of-seeded", "perturbed"],
    ["a-very-long-condition-name-from-a-study", "another-long-condition-name", "replay",
     "x" * 60, "live-again-with-a-long-name", "t0-seeded-long"],
])
def test_the_ladder_figure_has_no_overlapping_or_clipped_text(names):
    import matplotlib.pyplot as plt

    a = _analysis(names)
    truth = {"w": {c.name: {"true_w": c.stats.w} for c in a.conditions}}
    fig = report.figure(a, truth)
    try:
        assert clashes(fig) == []
    finally:
        plt.close(fig)
