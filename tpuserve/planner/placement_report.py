"""Render `plan --placements`: one table of the placements, cheapest $/M output tokens first,
each figure marked m (measured), v (vendor), s (setting) or d (derived), then what was left out
and why."""

from __future__ import annotations

from itertools import groupby

from rich import box
from rich.console import Console
from rich.table import Table

from tpuserve.planner.placements import Placement, Placements, Unpriced

LEGEND = ("m = measured (docs/measurements.md), v = vendor (read from Google's pages or a third "
          "party's catalog, not measured here), s = your [pricing] setting, d = derived "
          "(computed here; `--json` names each figure's source). Flex: whether the zone takes "
          "flex-start.")


# Wide enough for every column unwrapped: a narrower terminal wraps lines, it cuts no figure.
WIDTH = 175  # every column on one line, the longest price source (snapshot ...) included


# The figures of a placement, each shown with its mark: (field, format).
FIGURES: tuple[tuple[str, str], ...] = (
    ("tensor_parallel_size", "{:d}"), ("usd_per_hour", "${:.4f}"),
    ("output_tokens_per_second", "{:,.1f}"), ("usd_per_million_tokens", "${:.3f}"),
    ("kv_tokens", "{:,}"), ("kv_wall_clients", "{:,}"), ("flex_start_accepted", "{}"),
)


def _cell(p: Placement, name: str, fmt: str) -> str:
    value = getattr(p, name)
    text = ("yes" if value else "no") if isinstance(value, bool) else fmt.format(value)
    if name == "kv_wall_clients" and not p.fits_kv_wall:
        text += " (PAST)"
    return f"{text} {mark(p, name)}"


def mark(p: Placement, name: str) -> str:
    """One letter for how sure a field is: derived, vendor, setting, else measured."""
    for letter, names in (("d", p.derived), ("v", p.vendor), ("s", p.setting)):
        if name in names:
            return letter
    return "m"


def placements_table(result: Placements) -> Table:
    t = Table("accelerator", "zone", "model", "TP", "$/h", "tok/s", "$/M tok", "KV tokens",
              "KV wall", "flex", "price source",
              title=(f"Placements of {result.model} at {result.context:,} tokens x "
                     f"{result.clients} clients, cheapest first"),
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.columns[-1].no_wrap = True  # one line per placement: the source is read, not wrapped
    for p in result.placements:
        t.add_row(p.accelerator_type, f"{p.zone} {mark(p, 'zone')}", p.provisioning_model,
                  *(_cell(p, name, fmt) for name, fmt in FIGURES), p.price_source)
    return t


def print_placements(result: Placements, console: Console) -> None:
    if result.placements:
        # Its own console: print(width=) cannot widen past the terminal's width.
        wide = Console(file=console.file, width=max(console.width, WIDTH), highlight=False)
        wide.print(placements_table(result))
    else:
        console.print("no placement is priced: none to rank", markup=False)
    console.print(LEGEND, markup=False, soft_wrap=True)
    console.print(f"tok/s scaled from: {result.reference}", markup=False, soft_wrap=True)
    if any(not p.fits_kv_wall for p in result.placements):
        console.print(f"PAST: {result.clients} clients pass the KV wall there; past it more "
                      "clients buy queueing, not throughput (SPEC 6)", markup=False,
                      soft_wrap=True)
    # What fits and is offered but has no price: named, never priced by guess.
    def key(u: Unpriced) -> tuple[str, str]:
        return (u.accelerator_type, u.provisioning_model)

    for (accel, model), rows in groupby(sorted(result.unpriced, key=key), key=key):
        zones = ", ".join(u.zone for u in rows)
        console.print(f"unpriced {accel} {model}: {zones} (no price source names one)",
                      markup=False, soft_wrap=True)
    for n in result.no_zone:  # priced, but no source names a zone offering it there
        console.print(f"no zone {n.accelerator_type} {n.provisioning_model} {n.region}: "
                      f"{n.why}", markup=False, soft_wrap=True)
    for s in result.skipped:
        console.print(f"skipped {s.why}", markup=False, soft_wrap=True)
