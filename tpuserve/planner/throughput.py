"""Output tokens/s for a model on a slice: measured where it was measured, else derived.

Measured throughput exists for one pair only: Gemma 4 E2B on v5litepod-1, SPEC 6's 12 cells
(or a `bench` table of the configured deployment, `--throughput`). Any other model or slice is
derived from that reference, never borrowed from it: the nearest measured cell scaled by the
bytes a decode step moves (the streamed weights plus the KV read at the cell) over the slice's
HBM bandwidth. Decode is bandwidth-bound, so the time of a step follows bytes / bandwidth, at
the reference's measured efficiency. `plan` (every cell of its table) and `plan --placements`
(the expected cell) both derive here, so the two agree on a cell.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tpuserve.accelerators import ACCELERATORS, MEASURED_ACCELERATOR, Accelerator
from tpuserve.facts import GiB
from tpuserve.planner.arithmetic import (
    SPEC_THROUGHPUT,
    ModelGeometry,
    ThroughputCell,
    ThroughputTable,
    decode_bytes_per_step,
    load_geometry,
    padded_kv_heads,
)
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_inputs import model_inputs
from tpuserve.settings.model_profiles import DEFAULT_MODEL
from tpuserve.settings.sections import CapacitySettings

# What `plan --json`'s sources.throughput says of the measured pair (unchanged wording).
SPEC6_SOURCE = "measured SPEC 6 (Gemma 4 E2B, v5litepod-1)"


class Reference(NamedTuple):
    """The measured throughput every derived one is scaled from: a model on a slice."""

    model: str
    accelerator_type: str
    geometry: ModelGeometry
    table: ThroughputTable
    source: str  # "measured SPEC 6 (...)" or "measured (--throughput FILE)"


def spec6_reference() -> Reference:
    """Gemma 4 E2B on v5litepod-1, SPEC 6's 12 cells (the only throughput measured here)."""
    geometry = load_geometry(CapacitySettings().geometry_path)  # the measured SPEC 5 file
    return Reference(DEFAULT_MODEL, MEASURED_ACCELERATOR, geometry, SPEC_THROUGHPUT,
                     f"measured SPEC 6 ({DEFAULT_MODEL}, {MEASURED_ACCELERATOR})")


def geometry_of(d: Deployment) -> ModelGeometry:
    """The configured model's own geometry (never E2B's in its place)."""
    inputs = model_inputs(d)
    if inputs.problems or inputs.geometry_path is None:
        raise ValueError("; ".join(inputs.problems) or "no geometry for the model")
    return load_geometry(inputs.geometry_path)


def bench_reference(d: Deployment, table: ThroughputTable, label: str) -> Reference:
    """A `bench` table of the configured deployment: its model measured on its slice."""
    return Reference(d.vllm.model, d.tpu.accelerator_type, geometry_of(d), table,
                     f"measured ({label}: {d.vllm.model}, {d.tpu.accelerator_type})")


def step_bytes(geometry: ModelGeometry, tp: int, context: int, clients: int) -> int:
    """Bytes one decode step moves at a cell: the streamed weights, plus every layer's read of
    its KV source's cache (shared layers read it again; heads padded to TP are read too) over
    `context` tokens for each of `clients` requests."""
    kv_read = sum(padded_kv_heads(layer.num_kv_heads, tp) * 2 * layer.head_dim * 2
                  for layer in geometry.layers)
    return decode_bytes_per_step(geometry) + clients * context * kv_read


def _nearest(table: ThroughputTable, context: int, clients: int) -> ThroughputCell:
    """The measured cell to scale from: the same clients if measured, nearest context."""
    def distance(c: ThroughputCell) -> tuple[float, float, int, int]:
        return (abs(math.log2(c.clients / clients)), abs(math.log2(c.context / context)),
                c.clients, c.context)
    return min(table.cells, key=distance)


def _bandwidth(a: Accelerator) -> float:
    """The slice's HBM bandwidth: chips x per-chip (TP assumed to scale perfectly)."""
    return a.family.hbm_bandwidth_bytes_per_s * a.chips


class Throughput(NamedTuple):
    tok_s: float
    measured: bool
    source: str


def throughput(ref: Reference, model: str, geometry: ModelGeometry, a: Accelerator, tp: int,
               context: int, clients: int) -> Throughput:
    """Output tok/s at the cell: measured where the reference measured this model on this
    slice at this cell, else scaled from its nearest measured cell by bytes / bandwidth."""
    cell = ref.table.get(context, clients)
    if cell is not None and model == ref.model and a.accelerator_type == ref.accelerator_type:
        return Throughput(cell.output_tokens_per_s, True, f"{ref.source} at {cell.key}")
    near = _nearest(ref.table, context, clients)
    ref_accel = ACCELERATORS[ref.accelerator_type]
    ref_bw, bw = _bandwidth(ref_accel), _bandwidth(a)
    ref_bytes = step_bytes(ref.geometry, ref_accel.chips, near.context, near.clients)
    here = step_bytes(geometry, tp, context, clients)
    ref_step_s, step_s = ref_bytes / ref_bw, here / bw
    tok_s = near.output_tokens_per_s * (clients / near.clients) * (ref_step_s / step_s)
    return Throughput(tok_s, False, (
        f"derived: {ref.source} at {near.key} ({near.output_tokens_per_s:g} tok/s) scaled by "
        f"bytes moved per decode step over HBM bandwidth ({ref_bytes / GiB:.2f} GiB at "
        f"{ref_bw / GiB:.0f} GiB/s there, {here / GiB:.2f} GiB at {bw / GiB:.0f} GiB/s here: "
        f"weights streamed + KV read at {context}x{clients})"
        + ("" if clients == near.clients else
           f" and by clients ({clients} / {near.clients}: optimistic, batching saturates)")))


class PlanThroughput(NamedTuple):
    """The table `plan` prices by, whether it is measured, and its `sources.throughput`."""

    table: ThroughputTable
    measured: bool
    source: str


def is_measured_pair(d: Deployment) -> bool:
    """SPEC 6 measured Gemma 4 E2B on v5litepod-1 and nothing else."""
    return (d.vllm.model, d.tpu.accelerator_type) == (DEFAULT_MODEL, MEASURED_ACCELERATOR)


def plan_throughput(d: Deployment, bench: ThroughputTable | None = None,
                    bench_label: str = "--throughput") -> PlanThroughput:
    """The deployment's throughput table: a `bench` of it (measured, as given), SPEC 6 for the
    measured pair, else every SPEC 6 cell derived for this model on this slice."""
    if bench is not None:
        return PlanThroughput(bench, True, (f"measured ({bench_label}: {d.vllm.model}, "
                                            f"{d.tpu.accelerator_type})"))
    if is_measured_pair(d):
        return PlanThroughput(SPEC_THROUGHPUT, True, SPEC6_SOURCE)
    ref = spec6_reference()
    geometry = geometry_of(d)
    a = d.tpu.accelerator
    tp = d.vllm.tensor_parallel_size or a.chips
    cells = tuple(ThroughputCell(c.context, c.clients, throughput(
        ref, d.vllm.model, geometry, a, tp, c.context, c.clients).tok_s) for c in ref.table.cells)
    ref_accel = ACCELERATORS[ref.accelerator_type]
    weights_here = decode_bytes_per_step(geometry) / GiB
    weights_there = decode_bytes_per_step(ref.geometry) / GiB
    return PlanThroughput(ThroughputTable(cells), False, (
        f"derived: {d.vllm.model} on {a.accelerator_type} (TP {tp}), every cell "
        f"scaled from {SPEC6_SOURCE} by bytes per decode step and bandwidth: "
        "tok/s = its tok/s x (its bytes / its bandwidth) / (bytes / bandwidth), bytes = the "
        f"weights streamed ({weights_here:.2f} GiB here, {weights_there:.2f} GiB there) + the KV "
        f"read at the cell, bandwidth {_bandwidth(a) / GiB:.0f} GiB/s here, "
        f"{_bandwidth(ref_accel) / GiB:.0f} GiB/s there; at E2B's measured efficiency, TP "
        "assumed to scale perfectly (docs/planner.md)"))
