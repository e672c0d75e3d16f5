"""Render a fleet_cost.FleetPlan as rich tables (`tpuserve plan --stack fleet`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpuserve.planner.fleet_cost import BOUNDS, FIRST, LAST, PLACEMENTS, FleetPlan

_PLACE = {FIRST: "first choice", LAST: "last choice"}

# SPEC 7's cells for $/M output tokens, per replica.
_CELLS = ((128, 64), (1024, 64), (1024, 16), (8192, 16), (128, 1))


def _standin(f: FleetPlan, placement: str) -> str:
    """The mark of a column priced by a stand-in $/chip-hour (no source prices its pool)."""
    return ", stand-in" if f.costs["min"][placement].pool in f.standins else ""


def cost_table(f: FleetPlan) -> Table:
    cols = [f"{b} {f.replicas[b]} x {_PLACE[p]} ({f.costs[b][p].pool}{_standin(f, p)})"
            for b in BOUNDS for p in PLACEMENTS]
    t = Table("$/hour", *cols, title=f"Fleet cost: {f.min_replicas}-{f.max_replicas} replicas "
              f"of {f.chips_per_replica} chip(s), pools {' > '.join(f.provisioning)}")
    points = [f.costs[b][p] for b in BOUNDS for p in PLACEMENTS]
    t.add_row("TPU chips", *[f"${c.tpu_usd_per_hour:.4f}" for c in points])
    t.add_row("GKE cluster fee (list, no free tier)",
              *[f"${c.cluster_usd_per_hour:.4f}" for c in points])
    t.add_row(f"system pool ({f.system_machine_type}, list)",
              *["not priced" if c.system_usd_per_hour is None else
                f"{c.system_nodes} x = ${c.system_usd_per_hour:.4f}" for c in points])
    t.add_row("total $/hour", *[f"${c.usd_per_hour:.4f}" for c in points], style="bold")
    t.add_row(f"$/month ({f.hours_per_month:g} h)", *[f"${c.usd_per_month:,.0f}" for c in points],
              style="bold")
    return t


def throughput_table(f: FleetPlan) -> Table:
    derived = f.throughput_source is not None  # another model or slice: d, never SPEC 6's
    t = Table("context x clients/replica", "1 replica tok/s d" if derived else "1 chip tok/s",
              *[f"{b} {f.replicas[b]}: tok/s" for b in BOUNDS],
              *[f"{b}: $/M ({_PLACE[p]}{_standin(f, p)})" for b in BOUNDS for p in PLACEMENTS],
              title="Fleet throughput and $ per million output tokens (N x "
                    + ("derived tok/s, d)" if derived else "SPEC 6)"))
    for ctx, clients in _CELLS:
        c = f.cell(ctx, clients)
        if c is None:
            continue
        t.add_row(f"{ctx:,} x {clients}", f"{c.cell.output_tokens_per_s:,.1f}",
                  *[f"{c.at[b][1]:,.1f}" for b in BOUNDS],
                  *[f"${c.at[b][2][p]:.3f}" for b in BOUNDS for p in PLACEMENTS])
    return t


def print_fleet(f: FleetPlan, console: Console) -> None:
    console.print(cost_table(f))
    console.print(throughput_table(f))
    if f.kv_wall:
        walls = ", ".join(f"{ctx:,} ctx: {n:,} per replica ({n * f.min_replicas:,}-"
                          f"{n * f.max_replicas:,})" for ctx, n in f.kv_wall)
        console.print(f"KV wall (concurrent requests): {walls}", markup=False, soft_wrap=True)
    for pool, source in f.standins.items():
        console.print(f"{pool} $/chip-hour ${f.usd_per_chip_hour[pool]:.4f}: {source}; every $ "
                      f"figure of the {pool} pool is a stand-in until [pricing] {pool} is set",
                      markup=False, soft_wrap=True)
    console.print("Assumptions: " + "; ".join(f.assumptions) + ".", markup=False, soft_wrap=True)
    console.print(f.choose_when[0].upper() + f.choose_when[1:] + ".", markup=False,
                  soft_wrap=True)
