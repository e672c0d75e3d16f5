"""Render a benchmark: SPEC section 6's tables (context rows x client columns), the cost per
million output tokens per provisioning model (SPEC 7's arithmetic), and one PNG chart."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.table import Table

from tpuserve.planner.arithmetic import usd_per_million_tokens

from .bench_stats import CellStats

# SPEC 6 flags a TTFT cell whose repetitions disagree (cv 56%); above this we add the asterisk.
UNSTABLE_CV = 0.20


def _grid(
    cells: Sequence[CellStats], title: str, value: Callable[[CellStats], str], caption: str = ""
) -> Table:
    contexts = sorted({c.context for c in cells})
    clients = sorted({c.clients for c in cells})
    table = Table("context \\ clients", *[str(n) for n in clients], title=title,
                  caption=caption or None)
    by_key = {(c.context, c.clients): c for c in cells}
    for context in contexts:
        row = [f"{context:,}"]
        for n in clients:
            cell = by_key.get((context, n))
            row.append(value(cell) if cell else "-")
        table.add_row(*row)
    return table


def _cv_suffix(cv: float | None) -> str:
    return "" if cv is None else f" ±{cv * 100:.1f}%"


def _num(x: float | None, fmt: str = ",.1f") -> str:
    return "-" if x is None else format(x, fmt)


def tables(cells: Sequence[CellStats], usd_per_hour: Mapping[str, float]) -> list[Table]:
    """The tables, in SPEC 6's order, then the cost table."""
    out = [
        _grid(cells, "Aggregate output tokens/s (±cv across repetitions)",
              lambda c: _num(c.output_tokens_per_s) + _cv_suffix(c.output_tokens_per_s_cv)),
        _grid(
            cells, "Median time to first token (ms)",
            lambda c: _num(c.ttft_ms_median)
            + ("*" if (c.ttft_ms_median_cv or 0) > UNSTABLE_CV else ""),
            caption=f"* = cv > {UNSTABLE_CV:.0%} between repetitions: no point value is reliable",
        ),
        _grid(cells, "p90 time to first token (ms)", lambda c: _num(c.ttft_ms_p90)),
        _grid(cells, "Per-stream tokens/s", lambda c: _num(c.per_stream_tokens_per_s)),
        _grid(cells, "Time per output token, excluding the first (ms)",
              lambda c: _num(c.tpot_ms, ",.2f")),
        _grid(cells, "p99 time to first token (ms)", lambda c: _num(c.mean_of("ttft_ms_p99"))),
        _grid(cells, "Median inter-token latency (ms)",
              lambda c: _num(c.mean_of("itl_ms_median"), ",.2f")),
        _grid(cells, "Median end-to-end latency (ms)",
              lambda c: _num(c.mean_of("e2el_ms_median"))),
    ]
    if usd_per_hour:
        out.append(cost_table(cells, usd_per_hour))
    return out


def cost_table(cells: Sequence[CellStats], usd_per_hour: Mapping[str, float]) -> Table:
    """$/M output tokens = ($/hour) / (tokens/s x 3600) x 1e6, per provisioning model (SPEC 7)."""
    models = list(usd_per_hour)
    table = Table("context", "clients", "tok/s", *[f"{m} $/M" for m in models],
                  title="Cost per million output tokens")
    for c in sorted(cells, key=lambda c: (c.context, c.clients)):
        tok_s = c.output_tokens_per_s
        prices = [
            f"{usd_per_million_tokens(usd_per_hour[m], tok_s):.3f}" if tok_s > 0 else "-"
            for m in models
        ]
        table.add_row(f"{c.context:,}", str(c.clients), f"{tok_s:,.1f}", *prices)
    return table


def write_chart(cells: Sequence[CellStats], path: Path, title: str = "") -> Path:
    """Throughput and median TTFT against clients, one line per context, as a PNG.

    Written to a temporary file and renamed, so an interrupted run leaves no half chart."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax_tp, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for context in sorted({c.context for c in cells}):
        row = sorted((c for c in cells if c.context == context), key=lambda c: c.clients)
        xs = [c.clients for c in row]
        label = f"{context:,} ctx"
        ax_tp.plot(xs, [c.output_tokens_per_s for c in row], marker="o", label=label)
        ax_ttft.plot(xs, [c.ttft_ms_median for c in row], marker="o", label=label)
    clients = sorted({c.clients for c in cells})
    for ax, ylabel in ((ax_tp, "aggregate output tokens/s"), (ax_ttft, "median TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
    ax_tp.set_ylim(bottom=0)
    # TTFT spans orders of magnitude (SPEC 6: 15.9 ms to 11.7 s): log scale, plain numbers.
    ax_ttft.set_yscale("log")
    ax_ttft.yaxis.set_major_formatter(ScalarFormatter())
    ax_ttft.yaxis.set_minor_formatter(NullFormatter())
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
