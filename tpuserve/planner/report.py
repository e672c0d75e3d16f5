"""Render a planner.Plan: rich tables for the terminal, one PNG for the record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

from tpuserve.accelerators import ACCELERATORS
from tpuserve.planner.arithmetic import SPOT, GiB, Plan, ProvisioningCost


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def budget_table(plan: Plan, weights_label: str = "weights (measured)") -> Table:
    b = plan.budget
    t = Table("HBM budget", "bytes", "GiB", title="HBM budget (SPEC 5)")
    # The accelerator table's label of the slice's HBM: measured on v5e, derived on v6e.
    accel = ACCELERATORS.get(plan.chip.name)
    derived = accel is not None and not accel.family.hbm_measured
    rows = [
        ("visible to the runtime" + (" (derived, docs/accelerators.md)" if derived else ""),
         b.hbm_visible_bytes),
        (f"cap at gpu_memory_utilization {plan.gpu_memory_utilization}", b.cap_bytes),
        (weights_label, b.weights_bytes),
        ("KV pool", b.kv_pool_bytes),
        ("ungoverned remainder (XLA programs)", b.ungoverned_bytes),
    ]
    for label, n in rows:
        t.add_row(label, f"{n:,}", f"{n / GiB:.2f}")
    return t


def kv_table(plan: Plan) -> Table:
    t = Table(
        "attention",
        "head dim",
        "cache layers",
        "shared",
        "KV heads",
        "B/token",
        title=f"KV cache at TP={plan.tensor_parallel_size}",
    )
    for g in plan.kv_groups:
        t.add_row(
            g.attention,
            str(g.head_dim),
            str(g.cache_layers),
            str(g.shared_layers),
            str(g.padded_kv_heads),
            f"{g.bytes_per_token:,}",
        )
    t.add_row("total", "", "", "", "", f"{plan.kv_bytes_per_token:,}", style="bold")
    return t


def capacity_table(plan: Plan) -> Table:
    t = Table("quantity", "value", title=f"KV capacity at max-model-len {plan.max_model_len:,}")
    t.add_row("tokens in the pool", f"{plan.kv_tokens:,}")
    t.add_row("block size (Pallas backend)", str(plan.block_size))
    t.add_row("blocks", f"{plan.num_blocks:,}")
    t.add_row("blocks per request", f"{plan.blocks_per_request:,}")
    t.add_row("tokens in blocks", f"{plan.kv_block_tokens:,}")
    t.add_row("one max-model-len request fits", "yes" if plan.max_model_len_fits else "NO")
    if plan.sliding_window_kv_gain is not None:
        t.add_row("gain if sliding layers were windowed", f"{plan.sliding_window_kv_gain:.1f}x")
    for context, clients in plan.kv_wall:
        t.add_row(f"KV wall at {context:,} tokens", f"{clients:,} clients")
    return t


def decode_table(plan: Plan) -> Table:
    w = plan.weights
    t = Table("quantity", "value", title="Decode step and weights (SPEC 5)")
    t.add_row("per-layer embeddings (gathered)", _gib(w.per_layer_embeddings))
    t.add_row("embedding (lm_head reads it)", _gib(w.embedding))
    if w.lm_head:
        t.add_row("untied lm_head", _gib(w.lm_head))
    t.add_row("attention projections", _gib(w.attention))
    t.add_row("MLP projections", _gib(w.mlp))
    t.add_row("not explained by the text geometry", _gib(w.unexplained))
    t.add_row("bytes moved per decode step", _gib(plan.decode_bytes_per_step))
    t.add_row("bandwidth floor", f"{plan.decode_floor_s * 1e3:.2f} ms")
    if plan.measured_tpot_ms is not None and plan.bandwidth_efficiency is not None:
        t.add_row("measured TPOT", f"{plan.measured_tpot_ms:.2f} ms")
        t.add_row("share of peak bandwidth", f"{plan.bandwidth_efficiency:.0%}")
    return t


def _legend(*parts: str | None) -> str | None:
    return "; ".join(p for p in parts if p) or None


def cost_table(plan: Plan, mark: str = "", legend: str | None = None,
               measured: frozenset[str] = frozenset(), measured_legend: str | None = None
               ) -> Table:
    """The $/M table; `mark` labels a tok/s column that is not measured, `legend` says why;
    the rows of `measured` cells (keys) carry `m`, which `measured_legend` says where."""
    models = [c.model for c in plan.costs]
    # The mark heads the column (every cell of it is derived alike): a mark in each cell
    # would widen it past an 80-column terminal and wrap the rows.
    t = Table("context x clients", f"tok/s {mark}" if mark else "tok/s", *models,
              title="$ per million output tokens (SPEC 7)",
              caption=_legend(measured_legend if measured else None, legend),
              caption_justify="left")
    for i, cell in enumerate(plan.throughput.cells):
        prices = [f"${c.usd_per_million_output_tokens[i][1]:.3f}" for c in plan.costs]
        # A measured row is marked `m` (compact, so an 80-column terminal keeps it one line).
        label = f"{cell.context:,}x{cell.clients} m" if cell.key in measured else \
            f"{cell.context:,} x {cell.clients}"
        t.add_row(label, f"{cell.output_tokens_per_s:,.1f}", *prices)
    t.add_row("$/hour", "", *[f"${c.usd_per_hour:.4f}" for c in plan.costs], style="bold")
    t.add_row(
        f"$/month ({plan.hours_per_month:g} h)",
        "",
        *[f"${c.usd_per_month:,.0f}" for c in plan.costs],
        style="bold",
    )
    return t


def rebuild_table(plan: Plan, legend: str | None = None, measured: str | None = None,
                  measured_legend: str | None = None) -> Table | None:
    """Spot's rebuild cost against flex's premium; `legend`: the boot times are not this
    deployment's measured ones (the seconds column is marked `d`, the legend says whose);
    `measured`: the row ("cold" or "warm") a tune run measured, marked `m`."""
    r = plan.rebuild
    if r is None:
        return None
    t = Table(
        "rebuild",
        "seconds d" if legend else "seconds",
        "cost at spot",
        "spot beats flex if preempted less than every",
        title=f"Spot vs flex (flex premium ${r.flex_premium_usd_per_hour:.4f}/h)",
        caption=_legend(measured_legend if measured else None, legend),
        caption_justify="left",
    )
    cold_m, warm_m = (" m" if measured == kind else "" for kind in ("cold", "warm"))
    t.add_row(f"cold{cold_m}", f"{r.cold_s:g}", f"${r.cold_usd:.4f}",
              f"{r.break_even_cold_hours:.1f} h")
    t.add_row(
        f"warm (compile cache){warm_m}",
        f"{r.warm_s:g}",
        f"${r.warm_usd:.4f}",
        f"{r.break_even_warm_hours:.1f} h",
    )
    return t


def expected_table(plan: Plan, tok_s_label: str = "measured output tok/s") -> Table | None:
    e = plan.expected
    if e is None:
        return None
    t = Table("quantity", "value", title=f"Expected load: {e.clients} x {e.context:,} tokens")
    t.add_row("KV tokens requested", f"{e.requested_tokens:,}")
    t.add_row("KV tokens available", f"{e.kv_capacity_tokens:,}")
    t.add_row("fits under the KV wall", "yes" if e.fits else f"NO (max {e.max_clients} clients)")
    if e.output_tokens_per_s is not None:
        t.add_row(tok_s_label, f"{e.output_tokens_per_s:,.1f}")
    return t


def renderables(plan: Plan, labels: Mapping[str, str] | None = None) -> list[RenderableType]:
    """The plan's tables; `labels` relabels figures that are not measured (weights, tok_s;
    tok_s_mark and tok_s_legend mark the $/M table's tok/s column, rebuild_legend the rebuild
    table's boot times; tuned_cells, tuned_boot and tuned_legend the rows a tune measured)."""
    labels = labels or {}
    tables = [
        budget_table(plan, labels.get("weights", "weights (measured)")),
        kv_table(plan),
        capacity_table(plan),
        decode_table(plan),
        cost_table(plan, labels.get("tok_s_mark", ""), labels.get("tok_s_legend"),
                   frozenset(filter(None, labels.get("tuned_cells", "").split(","))),
                   labels.get("tuned_legend")),
        rebuild_table(plan, labels.get("rebuild_legend"), labels.get("tuned_boot"),
                      labels.get("tuned_legend")),
        expected_table(plan, labels.get("tok_s", "measured output tok/s")),
    ]
    return [t for t in tables if t is not None]


def print_plan(plan: Plan, console: Console, labels: Mapping[str, str] | None = None) -> None:
    for table in renderables(plan, labels):
        console.print(table)


def write_png(plan: Plan, path: str | Path, *, provisioning: str | None = None,
              derived: bool = False) -> None:
    """HBM budget as a stacked bar, and $/M output tokens against clients per context
    (`derived`: from a derived tok/s table, which the axis says)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or a TPU VM
    import matplotlib.pyplot as plt

    model = provisioning or (SPOT if plan.cost(SPOT) else plan.costs[0].model)
    cost = plan.cost(model)
    if cost is None:
        raise ValueError(f"no price for provisioning model {model!r}")
    fig, (hbm, usd) = plt.subplots(1, 2, figsize=(10, 4.5), width_ratios=(1, 2.5))
    _hbm_panel(hbm, plan)
    _usd_panel(usd, plan, cost, derived)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def _hbm_panel(hbm: Any, plan: Plan) -> None:
    """The HBM budget: weights, KV pool and the ungoverned rest stacked under the cap."""
    b = plan.budget
    bottom = 0.0
    for label, n in (
        ("weights", b.weights_bytes),
        ("KV pool", b.kv_pool_bytes),
        ("ungoverned", b.ungoverned_bytes),
    ):
        hbm.bar(0, n / GiB, bottom=bottom, label=f"{label} {n / GiB:.2f} GiB")
        bottom += n / GiB
    hbm.axhline(
        b.cap_bytes / GiB,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"cap {b.cap_bytes / GiB:.2f} GiB",
    )
    hbm.set_xticks([])
    hbm.set_ylabel("GiB")
    hbm.set_title("HBM budget")
    hbm.legend(fontsize=8, loc="lower center")


def _usd_panel(usd: Any, plan: Plan, cost: ProvisioningCost, derived: bool = False) -> None:
    """$ per million output tokens against concurrent clients, one line per context."""
    for context in plan.throughput.contexts:
        points = sorted(
            (cell.clients, dollars)
            for cell, dollars in cost.usd_per_million_output_tokens
            if cell.context == context
        )
        usd.plot(*zip(*points, strict=True), marker="o", label=f"{context:,} ctx")
    usd.set_xscale("log", base=2)
    clients = plan.throughput.client_counts
    usd.set_xticks(clients, [str(c) for c in clients])
    usd.set_yscale("log")
    usd.set_xlabel("concurrent clients")
    usd.set_ylabel("$ per million output tokens" + (" (derived tok/s)" if derived else ""))
    usd.set_title(f"{cost.model} at ${cost.usd_per_hour:.4f}/h")
    usd.legend(fontsize=8)
