"""The planner applied to a Deployment: the capacity rules synth enforces (SPEC 5-6)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tpuserve.planner.arithmetic import (
    ChipSpec,
    GiB,
    ModelGeometry,
    Plan,
    ThroughputTable,
    build_plan,
    load_geometry,
)
from tpuserve.settings.accelerator_rules import (
    ceiling_note,
    memory_ceiling,
    one_chip,
    tp_problems,
    tp_warnings,
)
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_inputs import DEFAULT_MODEL, model_inputs
from tpuserve.settings.pair_sources import has_measured_tpot


@lru_cache(maxsize=8)
def _geometry(path: Path) -> ModelGeometry:
    return load_geometry(path)


def chip_for(d: Deployment) -> ChipSpec:
    """The configured slice, per chip from the accelerator table (tpuserve/accelerators.py)."""
    a = d.tpu.accelerator
    return ChipSpec(
        name=a.accelerator_type,
        hbm_visible_bytes=a.family.hbm_visible_bytes,
        hbm_bandwidth_bytes_per_s=a.family.hbm_bandwidth_bytes_per_s,
        peak_bf16_flops=a.family.peak_bf16_flops,
        chips=a.chips,
    )


def plan_for(
    d: Deployment,
    *,
    geometry: ModelGeometry | None = None,
    throughput: ThroughputTable | None = None,
    chip: ChipSpec | None = None,
    **overrides: object,
) -> Plan:
    """build_plan with the deployment's settings; keyword overrides win (for `plan`)."""
    v, c = d.vllm, d.capacity
    inputs = model_inputs(d)
    if inputs.problems or inputs.geometry_path is None or inputs.weights_bytes is None:
        raise ValueError("; ".join(inputs.problems) or "no geometry or weights figure")
    priced = d.sourced_prices()  # no column priced with another chip's figure
    prices = {m: p.usd_per_chip_hour for m, p in priced.items()}
    kwargs: dict[str, object] = {
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "kv_cache_memory_bytes": v.kv_cache_memory_bytes,
        "max_model_len": v.max_model_len,
        "tensor_parallel_size": v.tensor_parallel_size,
        "weights_bytes": inputs.weights_bytes,
        "prices": prices,
        "price_sources": {m: {"price_source": p.source, "read_at": p.read_at, "sku": p.sku}
                          for m, p in priced.items()},
        "expected_clients": c.expected_clients,
        "expected_context": c.expected_context,
    }
    if v.max_num_seqs is not None:
        kwargs["max_num_seqs"] = v.max_num_seqs
    if not has_measured_tpot(d):
        # SPEC 5's TPOT is Gemma 4 E2B's on v5litepod-1: no other model's or chip's, and no
        # share of another chip's bandwidth computed from it (settings/pair_sources.py).
        kwargs["measured_tpot_ms"] = None
    if throughput is not None:
        kwargs["throughput"] = throughput
    kwargs.update(overrides)
    return build_plan(geometry or _geometry(inputs.geometry_path), chip or chip_for(d), **kwargs)  # type: ignore[arg-type]


def capacity_problems(d: Deployment) -> list[str]:
    """Hard capacity rules: synth refuses a deployment that cannot serve one full request."""
    inputs = model_inputs(d)
    if inputs.problems or inputs.geometry_path is None:
        return list(inputs.problems)
    try:
        geometry = _geometry(inputs.geometry_path)
    except (OSError, ValueError) as exc:
        return [f"{_geometry_name(d)}: {exc}"]
    if (trained := geometry.max_position_embeddings) and d.vllm.max_model_len > trained:
        return [(f"vllm.max_model_len = {d.vllm.max_model_len}: above the model's "
                 f"max_position_embeddings ({trained:,}, {_geometry_name(d)}); vLLM refuses "
                 "a context longer than the model's (derived from its config.json)")]
    tp = tp_problems(d.vllm, geometry, _geometry_name(d))
    if tp:
        return tp
    try:
        plan = plan_for(d, geometry=geometry)
    except ValueError as exc:
        cap = chip_for(d).total_hbm_bytes * d.vllm.gpu_memory_utilization / GiB
        return [
            (f"vllm.gpu_memory_utilization = {d.vllm.gpu_memory_utilization}: the cap "
            f"({cap:.2f} GiB) does not even hold the {_weights_gib(d, inputs.weights_bytes)} "
            f"GiB of weights ({_weights_name(d)}; SPEC 5: {exc})")
        ]
    if not plan.max_model_len_fits:
        return [
            (f"vllm.max_model_len = {d.vllm.max_model_len}: one request needs "
            f"{d.vllm.max_model_len:,} KV tokens but the pool holds "
            f"{plan.kv_block_tokens:,} ({plan.num_blocks:,} blocks of {plan.block_size}, "
            f"{plan.kv_bytes_per_token:,} B/token); the server would refuse to start "
            "(SPEC 5: HBM budget)")
        ]
    return []


def _geometry_name(d: Deployment) -> str:
    c = d.capacity
    if "model_geometry" in c.model_fields_set or d.vllm.model == DEFAULT_MODEL:
        return f"capacity.model_geometry = {c.model_geometry!r}"
    return f"config/models/{d.vllm.model}/config.json"


def _weights_name(d: Deployment) -> str:
    c = d.capacity
    if c.weights_index is not None:
        return f"capacity.weights_index = {c.weights_index!r} metadata.total_size"
    return "capacity.weights_gib"


def _weights_gib(d: Deployment, weights_bytes: int | None) -> float | str:
    if d.capacity.weights_index is None or weights_bytes is None:
        return d.capacity.weights_gib
    return f"{weights_bytes / GiB:.2f}"


def _fits_one_chip(d: Deployment, geometry: ModelGeometry) -> bool:
    """Whether one full request fits one chip of the slice's family at that chip's ceiling."""
    one = one_chip(d.tpu.accelerator)
    chip = chip_for(d)._replace(name=one.accelerator_type, chips=1)
    try:
        plan = plan_for(d, geometry=geometry, chip=chip, tensor_parallel_size=1,
                        gpu_memory_utilization=memory_ceiling(one).value)
    except ValueError:
        return False
    return plan.max_model_len_fits


def accelerator_warnings(d: Deployment) -> list[str]:
    """The slice's derived figures: the memory ceiling and the KV replication of TP."""
    out = ceiling_note(d.vllm, d.tpu.accelerator)
    inputs = model_inputs(d)
    if inputs.problems or inputs.geometry_path is None:
        return out  # reported as a problem
    try:
        geometry = _geometry(inputs.geometry_path)
    except (OSError, ValueError):
        return out  # reported as a problem
    fits = d.tpu.chips > 1 and _fits_one_chip(d, geometry)
    return out + tp_warnings(d.vllm, d.tpu.accelerator, geometry, fits_one_chip=fits)


def capacity_warnings(d: Deployment) -> list[str]:
    try:
        plan = plan_for(d)
    except (OSError, ValueError):
        return []  # reported as a problem
    out = accelerator_warnings(d)
    e = plan.expected
    if e is None or e.fits:
        return out
    return [
        *out,
        (f"capacity.expected_clients x expected_context = {e.clients} x {e.context:,} = "
        f"{e.requested_tokens:,} tokens passes the KV wall of {e.kv_capacity_tokens:,} live "
        f"tokens (at most {e.max_clients} clients at that context); SPEC 6: 64 x 8,192 "
        "past the wall took TTFT to 11.7 s")
    ]
