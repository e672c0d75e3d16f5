"""The vLLM settings the accelerator decides: tensor parallelism and the memory ceiling.

`tensor_parallel_size` follows the slice's chip count when unset; one below it is refused (the
other chips would idle) and one above it cannot run. The `gpu_memory_utilization` ceiling is
the measured 0.92 on v5litepod-1 (SPEC 4, a hard rule there); on any other slice it is derived
from the same measurements: keep, per chip, the 1.26 GiB the compiled programs had outside the
cap plus the 384.11 MiB the failing boot asked for there, never above the measured 0.92. The
rules that need the model's heads (settings/capacity.py loads its geometry) are here too.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tpuserve.accelerators import ACCELERATORS, MEASURED_ACCELERATOR, Accelerator
from tpuserve.facts import GPU_MEM_CEILING, OUTSIDE_CAP_ASK_MIB, UNGOVERNED_GIB_AT_CEILING
from tpuserve.planner.arithmetic import ModelGeometry, padded_kv_heads
from tpuserve.settings.base import spec_error
from tpuserve.settings.measured_rules import MEASURED_MODEL
from tpuserve.settings.vllm import VllmSettings

# Per chip, outside the cap: SPEC 4's two figures, in GiB (1.26 + 0.375 = 1.64 GiB).
OUTSIDE_CAP_GIB = UNGOVERNED_GIB_AT_CEILING + OUTSIDE_CAP_ASK_MIB / 1024


class Ceiling(NamedTuple):
    value: float
    measured: bool
    source: str  # measured (SPEC 4) or derived (from what)


def memory_ceiling(a: Accelerator) -> Ceiling:
    """The gpu_memory_utilization ceiling of one slice, labelled measured or derived."""
    if a.measured:
        return Ceiling(GPU_MEM_CEILING, True, f"measured on {a.accelerator_type} (SPEC 4)")
    visible = a.family.hbm_visible_gib
    raw = 1 - OUTSIDE_CAP_GIB / visible
    # Rounded DOWN to the two decimals the ceiling is stated in and checked against that same
    # number; the quotient is shown truncated, never rounded up past the ceiling.
    floored = math.floor(raw * 100) / 100
    value = min(floored, GPU_MEM_CEILING)
    seen = f"the highest value seen to boot, on {MEASURED_ACCELERATOR}"
    how = (f"rounded down to {value:.2f} (never above the measured {GPU_MEM_CEILING}, {seen})"
           if floored <= GPU_MEM_CEILING else
           f"rounded down to {floored:.2f}, capped at the measured {GPU_MEM_CEILING} ({seen})")
    return Ceiling(value, False, (
        f"derived: 1 - ({UNGOVERNED_GIB_AT_CEILING} GiB ungoverned + {OUTSIDE_CAP_ASK_MIB} MiB "
        f"asked outside the cap, SPEC 4) / {visible:g} GiB visible per {a.family.name} chip "
        f"= {math.floor(raw * 1e4) / 1e4:.4f}, {how}; not measured on {a.accelerator_type}"))


def _replica_slice(a: Accelerator, tp: int) -> Accelerator:
    """The largest slice of the same family a replica of TP `tp` fills."""
    return max((b for b in ACCELERATORS.values() if b.family is a.family and b.chips <= tp),
               key=lambda b: b.chips)


def one_chip(a: Accelerator) -> Accelerator:
    """The one-chip slice of the same family: what a replica on the fleet runs."""
    return _replica_slice(a, 1)


def settled_vllm(v: VllmSettings, a: Accelerator, *, kind_title: str, on_gke: bool
                 ) -> VllmSettings:
    """The [vllm] settings with what the slice derives filled in; ValueError (one line) for a
    tensor parallelism or a memory ceiling the slice cannot serve."""
    chips, name = a.chips, a.accelerator_type
    tp = chips if v.tensor_parallel_size is None else v.tensor_parallel_size
    if tp > chips:
        raise spec_error(
            "vllm.tensor_parallel_size", tp, f"must be <= the {chips} chip(s) of {name}",
            "SPEC 4: tensor parallelism splits the model across chips")
    if tp < chips:
        where = ("each fleet node holds the whole slice and its pod takes every chip"
                 if on_gke else f"the {kind_title} is one vLLM server on the slice")
        raise spec_error(
            "vllm.tensor_parallel_size", tp,
            f"below the {chips} chips of {name}: {chips - tp} would idle; unset it (TP = "
            f"{chips}) or serve replicas on the fleet with tpu.accelerator_type = "
            f"'{_replica_slice(a, tp).accelerator_type}'",
            f"derived: {where}")
    update: dict[str, object] = {"tensor_parallel_size": tp}
    ceiling = memory_ceiling(a)
    if not ceiling.measured:
        if "gpu_memory_utilization" not in v.model_fields_set:
            update["gpu_memory_utilization"] = ceiling.value
        elif v.gpu_memory_utilization > ceiling.value:
            raise spec_error(
                "vllm.gpu_memory_utilization", v.gpu_memory_utilization,
                f"above the ceiling {ceiling.value} of {name}; unset it for the ceiling",
                ceiling.source)
    return v.model_copy(update=update)


def ceiling_note(v: VllmSettings, a: Accelerator) -> list[str]:
    """Synth's and plan's line for a derived ceiling: what the value is and where it is from."""
    ceiling = memory_ceiling(a)
    if ceiling.measured:
        return []
    return [(f"vllm.gpu_memory_utilization = {v.gpu_memory_utilization}: the ceiling on "
             f"{a.accelerator_type} is {ceiling.value} ({ceiling.source})")]


def tp_problems(v: VllmSettings, geometry: ModelGeometry, geometry_setting: str) -> list[str]:
    """A TP that does not divide the attention heads: vLLM shards whole heads per chip."""
    tp, heads = v.tensor_parallel_size, geometry.num_attention_heads
    if tp is None or heads % tp == 0:
        return []
    return [(f"vllm.tensor_parallel_size = {tp}: does not divide the model's {heads} attention "
             f"heads ({geometry_setting}: num_attention_heads); use a slice whose chip count "
             f"divides {heads} (derived: tensor parallelism shards whole heads across chips)")]


def kv_replication(geometry: ModelGeometry, tp: int) -> tuple[int, int, float] | None:
    """(KV heads, heads held after padding to TP, the KV memory factor) when TP exceeds the
    model's KV heads, else None."""
    kv = min(geometry.num_key_value_heads, geometry.num_global_key_value_heads)
    if tp <= kv:
        return None
    padded = padded_kv_heads(kv, tp)
    return kv, padded, padded / kv


def tp_warnings(v: VllmSettings, a: Accelerator, geometry: ModelGeometry, *,
                fits_one_chip: bool) -> list[str]:
    """The derived KV replication cost (the measured model has its measured rule instead)."""
    tp = v.tensor_parallel_size or a.chips
    rep = kv_replication(geometry, tp)
    if rep is None or v.model == MEASURED_MODEL:
        return []
    kv, padded, factor = rep
    out = (f"vllm.tensor_parallel_size = {tp}: the model has {kv} KV head(s), padded to "
           f"{padded} for TP {tp}, so KV memory is paid {factor:g}x for replicated heads "
           "(derived from the geometry's num_key_value_heads: runtimes pad KV heads to a "
           "multiple of TP, SPEC 4)")
    if fits_one_chip:
        one = _replica_slice(a, 1).accelerator_type
        out += (f"; the model fits one chip: {a.chips} replicas of {one} on the fleet serve "
                "cheaper than one TP server (derived)")
    return [out]
