"""The Pareto chart as a PNG: $/M output tokens across, worst-cell p90 TTFT up, titled and with
labelled axes; every measured candidate grey, the Pareto set blue, the chosen one green with a
ring. Drawn with matplotlib (a dependency already: `plan --png`, `bench`), imported only here
and only when a chart is written."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TITLE = "tpuserve tune: measured candidates, Pareto set and choice"
X_LABEL = "$ per million output tokens (at the stack's price)"
Y_LABEL = "worst-cell TTFT p90 (ms)"
GREY, BLUE, GREEN = "#969696", "#1e5ac8", "#14a03c"


def ranges(points: Mapping[str, tuple[float, float]]) -> tuple[float, float, float, float]:
    xs = [p[0] for p in points.values()] or [0.0]
    ys = [p[1] for p in points.values()] or [0.0]
    return min(xs), max(xs), min(ys), max(ys)


def figure(points: Mapping[str, tuple[float, float]], pareto: set[str], best: str | None
           ) -> Any:
    """The chart as a matplotlib Figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or a TPU VM
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    ax = fig.add_subplot()
    groups = (("measured", [k for k in points if k not in pareto], GREY, 20),
              ("Pareto set", [k for k in points if k in pareto], BLUE, 28))
    for label, ids, colour, size in groups:
        if ids:
            ax.scatter([points[k][0] for k in ids], [points[k][1] for k in ids], s=size,
                       color=colour, label=label, zorder=2)
    if best in points:
        x, y = points[best]
        ax.scatter([x], [y], s=160, facecolors="none", edgecolors=GREEN, linewidths=2,
                   label=f"chosen: {best}", zorder=3)
    if not points:
        ax.text(0.5, 0.5, "no feasible candidate measured", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_title(TITLE, fontsize=10)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.grid(True, linewidth=0.5, alpha=0.5)
    if points:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def render(points: Mapping[str, tuple[float, float]], pareto: set[str], best: str | None
           ) -> bytes:
    out = io.BytesIO()
    figure(points, pareto, best).savefig(out, format="png")
    return out.getvalue()


def write(path: Path, points: Mapping[str, tuple[float, float]], pareto: set[str],
          best: str | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".png.tmp")
    tmp.write_bytes(render(points, pareto, best))
    tmp.replace(path)
    return path
