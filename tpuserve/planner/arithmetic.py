"""Capacity and cost planner: HBM budget, KV cache, decode floor and $/token (SPEC 5-7).

Every SPEC section 5-7 figure is *recomputed* here from four inputs: the model's text
geometry (a Hugging Face config.json), the chip, the $/chip-hour prices and a throughput
table. Nothing derived is stored; the only stored numbers are measurements (cited).
The arithmetic is pure; the only I/O is `load_geometry` and `load_throughput`.

Throughput table JSON (written by the `bench` command, read by `load_throughput`)::

    {
      "cells": [
        {"context": 128, "clients": 64, "output_tokens_per_s": 1496.5, ...},
        ...
      ],
      ...
    }

- `cells` (required): one object per (context, clients) pair, no duplicates.
- `context` (int > 0): prompt tokens per request; `clients` (int > 0): concurrent streams;
  `output_tokens_per_s` (number > 0): aggregate output tokens/s over all clients.
- Any other key, in a cell or at the top level (ttft_ms, reps, cv, image, ...), is ignored
  here, so the bench command may record more.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tpuserve import kinds
from tpuserve.accelerators import V5E as ACCEL_V5E
from tpuserve.facts import (
    COLD_START_S,
    E2B_MEASURED_TPOT_MS,
    E2B_WEIGHTS_GIB,
    GPU_MEM_CEILING,
    HOURS_PER_MONTH,
    PRICES_USD_PER_CHIP_HOUR,
    WARM_START_S,
    GiB,
)
from tpuserve.planner.geometry import (
    FULL,
    SLIDING,
    GeometryError,
    TextConfig,
    parse_text_config,
    read_config,
)

BF16_BYTES = 2

E2B_WEIGHTS_BYTES = round(E2B_WEIGHTS_GIB * GiB)
# SPEC 4: vLLM's max_num_seqs default on this path.
DEFAULT_MAX_NUM_SEQS = 256

# The price keys of the kinds the rebuild economics compare (tpuserve/kinds).
SPOT = kinds.SPOT.price_key
FLEX = kinds.FLEX.price_key
ONDEMAND = kinds.ONDEMAND.price_key
DEFAULT_PRICES_USD_PER_CHIP_HOUR = PRICES_USD_PER_CHIP_HOUR
# Where a price came from, as plan --json's provisioning entries carry it (tpuserve/prices'
# Price: source, read_at, sku); the default prices are SPEC 2's (read_at "": its log is dated
# by month only).
PriceTag = Mapping[str, str | None]
SPEC2_TAG: PriceTag = {"price_source": "SPEC 2", "read_at": "", "sku": None}
# A price build_plan was given without its source: said so, never taken for SPEC 2's.
UNSTATED_TAG: PriceTag = {"price_source": "unstated: build_plan was given no price source",
                          "read_at": "", "sku": None}

# tpu-inference PallasAttentionBackend: the block table of every request lives in half of
# the 1 MiB SMEM as int32, so max_num_seqs x pages_per_request x 4 B <= 512 KiB.
_SMEM_BYTES = 1024 * 1024
_BLOCK_TABLE_ENTRY_BYTES = 4


# --------------------------------------------------------------------------- geometry


class LayerSpec(NamedTuple):
    """One decoder layer as the KV cache and the decode step see it."""

    index: int
    attention: str  # SLIDING or FULL
    head_dim: int
    num_kv_heads: int
    intermediate_size: int
    kv_source: int  # layer whose cache this layer reads; itself when it owns one

    @property
    def owns_kv(self) -> bool:
        return self.kv_source == self.index


@dataclass(frozen=True)
class ModelGeometry:
    """The text-decoder fields the planner needs, one value per layer where they vary."""

    num_hidden_layers: int
    num_kv_shared_layers: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    num_attention_heads: int
    num_key_value_heads: int
    num_global_key_value_heads: int
    head_dim: int
    global_head_dim: int
    hidden_size: int
    intermediate_sizes: tuple[int, ...]
    vocab_size: int
    vocab_size_per_layer_input: int
    hidden_size_per_layer_input: int
    tie_word_embeddings: bool
    # The context the checkpoint was trained for (None when its config.json does not say).
    max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        if n <= 0:
            raise ValueError(f"num_hidden_layers must be > 0, got {n}")
        if len(self.layer_types) != n:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, expected {n}")
        if len(self.intermediate_sizes) != n:
            raise ValueError(
                f"intermediate_size has {len(self.intermediate_sizes)} entries, expected {n}"
            )
        if not 0 <= self.num_kv_shared_layers < n:
            raise ValueError(
                f"num_kv_shared_layers must be in [0, {n}), got {self.num_kv_shared_layers}"
            )
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_window is required when a layer is sliding_attention")
        for i in range(self.first_shared_layer, n):
            self._kv_source(i)  # a shared layer without a source: say so now, not mid-plan

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelGeometry:
        """Read a Hugging Face config.json, at top level or nested under text_config.

        Strictly validated (planner.geometry): GeometryError names the field, value and rule.
        """
        text, outer_tie = parse_text_config(config)
        n = text.num_hidden_layers
        tie = text.tie_word_embeddings
        try:
            return cls(
                num_hidden_layers=n,
                num_kv_shared_layers=text.num_kv_shared_layers or 0,
                layer_types=_layer_types(text, n),
                sliding_window=text.sliding_window,
                num_attention_heads=text.num_attention_heads,
                num_key_value_heads=text.kv_heads,
                num_global_key_value_heads=text.num_global_key_value_heads or text.kv_heads,
                head_dim=text.dim_per_head,
                global_head_dim=text.global_head_dim or text.dim_per_head,
                hidden_size=text.hidden_size,
                intermediate_sizes=_intermediate_sizes(text.intermediate_size, n),
                vocab_size=text.vocab_size,
                vocab_size_per_layer_input=text.vocab_size_per_layer_input or text.vocab_size,
                hidden_size_per_layer_input=text.hidden_size_per_layer_input or 0,
                tie_word_embeddings=(tie if tie is not None else
                                     outer_tie if outer_tie is not None else True),
                max_position_embeddings=(text.max_position_embeddings
                                         or config.get("max_position_embeddings")),
            )
        except ValueError as exc:  # the cross-field rules of __post_init__
            raise GeometryError([str(exc)]) from None

    @property
    def first_shared_layer(self) -> int:
        # SPEC 5: only layers 0 .. L - num_kv_shared - 1 own a KV cache.
        return self.num_hidden_layers - self.num_kv_shared_layers

    @functools.cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        # Built once per geometry (frozen: the same every time), not on every read: one plan
        # reads it for each of its figures.
        return tuple(self._layer(i) for i in range(self.num_hidden_layers))

    def _layer(self, i: int) -> LayerSpec:
        kind = self.layer_types[i]
        full = kind == FULL
        return LayerSpec(
            index=i,
            attention=kind,
            # SPEC 5: full layers use global_head_dim for K and V, not only Q.
            head_dim=self.global_head_dim if full else self.head_dim,
            num_kv_heads=self.num_global_key_value_heads if full else self.num_key_value_heads,
            intermediate_size=self.intermediate_sizes[i],
            kv_source=self._kv_source(i),
        )

    def _kv_source(self, i: int) -> int:
        first_shared = self.first_shared_layer
        if i < first_shared:
            return i
        # SPEC 5: a shared layer reads the last preceding cache-owning layer of its type.
        for j in range(first_shared - 1, -1, -1):
            if self.layer_types[j] == self.layer_types[i]:
                return j
        kind = self.layer_types[i]
        raise ValueError(f"num_kv_shared_layers = {self.num_kv_shared_layers}: shared layer {i} "
                         f"({kind}) has no earlier cache-owning {kind} layer to read KV from")


def _layer_types(text: TextConfig, n: int) -> tuple[str, ...]:
    if text.layer_types is not None:
        return tuple(text.layer_types)
    if text.sliding_window is None or text.use_sliding_window is False:
        return (FULL,) * n
    every = text.sliding_window_pattern
    if every is None:
        raise GeometryError([
            ("sliding_window is set but neither 'layer_types' nor 'sliding_window_pattern' "
            "says which layers slide")])
    # HF Gemma 3 convention: every Nth layer is full.
    return tuple(FULL if i % every == every - 1 else SLIDING for i in range(n))


def _intermediate_sizes(value: int | list[int], n: int) -> tuple[int, ...]:
    if isinstance(value, list):  # Gemma 3n style: one entry per layer
        return tuple(value)
    return (value,) * n


def load_geometry(path: str | Path) -> ModelGeometry:
    """A geometry file, strictly validated; GeometryError (a ValueError) or OSError."""
    return ModelGeometry.from_hf_config(read_config(path))


# --------------------------------------------------------------------------- KV cache


class KVGroup(NamedTuple):
    """Cache-owning layers sharing one attention type and head dim."""

    attention: str
    head_dim: int
    cache_layers: int
    shared_layers: int
    padded_kv_heads: int
    bytes_per_token: int


def padded_kv_heads(num_kv_heads: int, tensor_parallel_size: int) -> int:
    # SPEC 4/5: runtimes pad KV heads up to a multiple of TP (one head at TP=4 pays 4x).
    if tensor_parallel_size <= 0:
        raise ValueError(f"tensor_parallel_size must be > 0, got {tensor_parallel_size}")
    return math.ceil(num_kv_heads / tensor_parallel_size) * tensor_parallel_size


def layer_kv_bytes_per_token(
    layer: LayerSpec, *, tensor_parallel_size: int = 1, dtype_bytes: int = BF16_BYTES
) -> int:
    if not layer.owns_kv:
        return 0
    heads = padded_kv_heads(layer.num_kv_heads, tensor_parallel_size)
    return heads * 2 * layer.head_dim * dtype_bytes  # 2 = K and V


def kv_breakdown(
    geometry: ModelGeometry, *, tensor_parallel_size: int = 1, dtype_bytes: int = BF16_BYTES
) -> tuple[KVGroup, ...]:
    """Bytes per token per (attention type, head dim); the sum is kv_bytes_per_token.

    dtype_bytes stays 2: SPEC 4 measured fp8 KV at 1.000x capacity (word-aligned layout).
    """
    groups: dict[tuple[str, int], list[LayerSpec]] = {}
    for layer in geometry.layers:
        groups.setdefault((layer.attention, layer.head_dim), []).append(layer)
    return tuple(
        KVGroup(
            attention=kind,
            head_dim=head_dim,
            cache_layers=sum(1 for layer in layers if layer.owns_kv),
            shared_layers=sum(1 for layer in layers if not layer.owns_kv),
            padded_kv_heads=padded_kv_heads(layers[0].num_kv_heads, tensor_parallel_size),
            bytes_per_token=sum(
                layer_kv_bytes_per_token(
                    layer, tensor_parallel_size=tensor_parallel_size, dtype_bytes=dtype_bytes
                )
                for layer in layers
            ),
        )
        for (kind, head_dim), layers in groups.items()
    )


def kv_bytes_per_token(
    geometry: ModelGeometry, *, tensor_parallel_size: int = 1, dtype_bytes: int = BF16_BYTES
) -> int:
    groups = kv_breakdown(
        geometry, tensor_parallel_size=tensor_parallel_size, dtype_bytes=dtype_bytes
    )
    return sum(g.bytes_per_token for g in groups)


def sliding_window_kv_gain(
    geometry: ModelGeometry, context: int, *, tensor_parallel_size: int = 1
) -> float:
    """KV capacity multiplier if sliding layers kept only their window (SPEC 5: 2.8x at 16K).

    tpu-inference gives every layer full-length KV for models with two head dims (SPEC 5).
    """
    full_length = windowed = 0
    for layer in geometry.layers:
        per_token = layer_kv_bytes_per_token(layer, tensor_parallel_size=tensor_parallel_size)
        full_length += per_token * context
        span = context
        if layer.attention == SLIDING and geometry.sliding_window:
            span = min(context, geometry.sliding_window)
        windowed += per_token * span
    return full_length / windowed


# --------------------------------------------------------------------------- HBM budget


class ChipSpec(NamedTuple):
    """One TPU slice; defaults are one v5e chip (SPEC 5)."""

    name: str = "v5e"
    # Per chip, from the accelerator table (tpuserve/accelerators.py states each with its
    # source): v5e's 15.75 GiB visible (SPEC 5, measured), 800 GiB/s and 197 TFLOPS (vendor).
    hbm_visible_bytes: int = ACCEL_V5E.hbm_visible_bytes
    hbm_bandwidth_bytes_per_s: float = ACCEL_V5E.hbm_bandwidth_bytes_per_s
    peak_bf16_flops: float = ACCEL_V5E.peak_bf16_flops
    chips: int = 1

    @property
    def total_hbm_bytes(self) -> int:
        return self.hbm_visible_bytes * self.chips

    @property
    def total_bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_bytes_per_s * self.chips


V5E = ChipSpec()


class HbmBudget(NamedTuple):
    hbm_visible_bytes: int
    cap_bytes: int  # hbm_visible x gpu_memory_utilization: what vLLM may give weights + KV
    weights_bytes: int
    kv_pool_bytes: int
    ungoverned_bytes: int  # SPEC 4: compiled XLA programs live here (1.26 GiB at 0.92)


def hbm_budget(
    chip: ChipSpec,
    *,
    gpu_memory_utilization: float,
    weights_bytes: int,
    kv_cache_memory_bytes: int | None = None,
) -> HbmBudget:
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    visible = chip.total_hbm_bytes
    cap = math.floor(visible * gpu_memory_utilization)
    # SPEC 4: --kv-cache-memory fixes the pool in bytes instead of the fraction.
    pool = cap - weights_bytes if kv_cache_memory_bytes is None else kv_cache_memory_bytes
    if pool <= 0:
        raise ValueError(f"no KV pool: weights {weights_bytes} B fill the cap {cap} B")
    ungoverned = visible - weights_bytes - pool
    if ungoverned < 0:
        raise ValueError(f"weights + KV pool exceed the {visible} B of visible HBM")
    return HbmBudget(visible, cap, weights_bytes, pool, ungoverned)


def kv_tokens(pool_bytes: int, bytes_per_token: int) -> int:
    return pool_bytes // bytes_per_token


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def pallas_block_size(max_model_len: int, *, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> int:
    """The KV block size the tpu-inference Pallas backend picks when --block-size is unset.

    The SMEM floor keeps blocks per request at 2**19 / 4 / max_num_seqs (512 at the default
    256), rounded up to a power of two: 16384 -> 32 and 32768 -> 64 as measured (SPEC 4).
    The max_model_len <= 8192 branch (next_power_of_2(len) / 16, clamped to [16, 256]) is
    the backend's source heuristic and was not measured here.
    """
    if max_model_len <= 0 or max_num_seqs <= 0:
        raise ValueError("max_model_len and max_num_seqs must be > 0")
    pages_per_request = _SMEM_BYTES // 2 // max_num_seqs // _BLOCK_TABLE_ENTRY_BYTES
    smem_floor = _next_power_of_2(math.ceil(max_model_len / pages_per_request))
    if max_model_len > 8192:
        heuristic = 16
    else:
        heuristic = min(max(_next_power_of_2(max_model_len) // 16, 16), 256)
    return max(heuristic, smem_floor)


def num_blocks(pool_bytes: int, block_size: int, bytes_per_token: int) -> int:
    return pool_bytes // (block_size * bytes_per_token)


def fits_one_request(kv_capacity_tokens: int, max_model_len: int) -> bool:
    """vLLM refuses to boot unless one request of max_model_len fits the KV pool."""
    return kv_capacity_tokens >= max_model_len


def kv_wall_clients(blocks: int, block_size: int, context: int) -> int:
    """Most requests of `context` tokens the pool holds at once (SPEC 6 "KV wall").

    Block-granular: each request takes whole blocks; equals floor(tokens / context) when
    context is a multiple of the block size.
    """
    return blocks // math.ceil(context / block_size)


# --------------------------------------------------------------------------- weights, decode


class WeightsBreakdown(NamedTuple):
    """What the text geometry explains of the measured resident weights, in bytes."""

    per_layer_embeddings: int  # SPEC 5: 4.38 GiB, gathered per token, not streamed
    embedding: int  # SPEC 5: 0.75 GiB tied embedding, read whole by lm_head
    lm_head: int  # 0 when tied
    attention: int
    mlp: int
    measured: int

    @property
    def explained(self) -> int:
        parts = (self.per_layer_embeddings, self.embedding, self.lm_head, self.attention)
        return sum(parts) + self.mlp

    @property
    def unexplained(self) -> int:
        """Vision/audio towers, norms, per-layer-input gates and projections, ..."""
        return self.measured - self.explained


def attention_params(geometry: ModelGeometry, layer: LayerSpec) -> int:
    # Every layer keeps its k/v projections, shared-KV ones included: the bf16 checkpoint
    # carries them and SPEC 5's ~3.15 GiB per decode step needs them (without them the sum
    # is 3.11 GiB).
    q = geometry.hidden_size * geometry.num_attention_heads * layer.head_dim
    kv = 2 * geometry.hidden_size * layer.num_kv_heads * layer.head_dim
    o = geometry.num_attention_heads * layer.head_dim * geometry.hidden_size
    return q + kv + o


def mlp_params(geometry: ModelGeometry, layer: LayerSpec) -> int:
    return 3 * geometry.hidden_size * layer.intermediate_size  # gate, up, down


def weights_breakdown(
    geometry: ModelGeometry, measured_bytes: int, *, dtype_bytes: int = BF16_BYTES
) -> WeightsBreakdown:
    layers = geometry.layers
    embedding = geometry.vocab_size * geometry.hidden_size * dtype_bytes
    per_layer = (
        geometry.vocab_size_per_layer_input
        * geometry.hidden_size_per_layer_input
        * geometry.num_hidden_layers
        * dtype_bytes
    )
    return WeightsBreakdown(
        per_layer_embeddings=per_layer,
        embedding=embedding,
        lm_head=0 if geometry.tie_word_embeddings else embedding,
        attention=sum(attention_params(geometry, layer) for layer in layers) * dtype_bytes,
        mlp=sum(mlp_params(geometry, layer) for layer in layers) * dtype_bytes,
        measured=measured_bytes,
    )


def decode_bytes_per_step(geometry: ModelGeometry, *, dtype_bytes: int = BF16_BYTES) -> int:
    """Weight bytes one decode step streams (SPEC 5: ~3.15 GiB, derived).

    Attention and MLP projections of every layer plus the vocab x hidden matrix lm_head
    reads. Per-layer embeddings are gathered, not streamed; KV reads depend on the batch and
    are left out, as in SPEC 5.
    """
    w = weights_breakdown(geometry, 0, dtype_bytes=dtype_bytes)
    lm_head = w.lm_head or w.embedding
    return w.attention + w.mlp + lm_head


def decode_floor_s(bytes_per_step: int, chip: ChipSpec) -> float:
    return bytes_per_step / chip.total_bandwidth_bytes_per_s


def bandwidth_efficiency(floor_s: float, measured_tpot_s: float) -> float:
    return floor_s / measured_tpot_s


# --------------------------------------------------------------------------- cost


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600) * 1e6


def cost_for_hours(usd_per_hour: float, hours: float) -> float:
    return usd_per_hour * hours


def rebuild_cost_usd(usd_per_hour: float, rebuild_s: float) -> float:
    return usd_per_hour * rebuild_s / 3600


def break_even_preemption_hours(rebuild_s: float, spot_usd: float, flex_usd: float) -> float:
    """Spot beats flex while preemptions come less often than this (SPEC 7)."""
    premium = flex_usd - spot_usd
    if premium <= 0:
        return math.inf if premium == 0 else 0.0
    return rebuild_cost_usd(spot_usd, rebuild_s) / premium


class ThroughputCell(NamedTuple):
    context: int
    clients: int
    output_tokens_per_s: float

    @property
    def key(self) -> str:
        return f"{self.context}x{self.clients}"


@dataclass(frozen=True)
class ThroughputTable:
    cells: tuple[ThroughputCell, ...]

    def __post_init__(self) -> None:
        keys = [c.key for c in self.cells]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(f"throughput table has duplicate cells {duplicates}")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ThroughputTable:
        cells = data.get("cells")
        if not isinstance(cells, list) or not cells:
            raise ValueError("throughput JSON needs a non-empty 'cells' list")
        return cls(tuple(_cell(c, i) for i, c in enumerate(cells)))

    def to_json(self) -> dict[str, Any]:
        return {"cells": [_cell_json(c) for c in self.cells]}

    @property
    def contexts(self) -> tuple[int, ...]:
        return tuple(sorted({c.context for c in self.cells}))

    @property
    def client_counts(self) -> tuple[int, ...]:
        return tuple(sorted({c.clients for c in self.cells}))

    def get(self, context: int, clients: int) -> ThroughputCell | None:
        return next((c for c in self.cells if (c.context, c.clients) == (context, clients)), None)

    def batching_gain(self, context: int) -> float | None:
        """Cost per token at the fewest clients / at the most (SPEC 7: 12.1x at 128 ctx)."""
        row = sorted((c for c in self.cells if c.context == context), key=lambda c: c.clients)
        if len(row) < 2:
            return None
        return row[-1].output_tokens_per_s / row[0].output_tokens_per_s


def _cell(raw: Any, i: int) -> ThroughputCell:
    if not isinstance(raw, Mapping):
        # ValueError like every other malformed-input error, so callers catch one type.
        raise ValueError(f"cells[{i}] must be an object")
    for key in ("context", "clients", "output_tokens_per_s"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"cells[{i}].{key} must be a positive number, got {value!r}")
    for key in ("context", "clients"):
        if int(raw[key]) != raw[key]:
            raise ValueError(f"cells[{i}].{key} must be an integer, got {raw[key]!r}")
    return ThroughputCell(
        int(raw["context"]), int(raw["clients"]), float(raw["output_tokens_per_s"])
    )


def _cell_json(cell: ThroughputCell) -> dict[str, Any]:
    return {
        "context": cell.context,
        "clients": cell.clients,
        "output_tokens_per_s": cell.output_tokens_per_s,
    }


def _spec_throughput() -> ThroughputTable:
    # SPEC 6: aggregate output tokens/s, 12 cells x 3 reps, cv <= 3.4% (measured).
    rows = {
        128: (123.7, 433.9, 1152.5, 1496.5),
        1024: (120.4, 415.4, 991.0, 1258.7),
        8192: (94.2, 254.4, 399.6, 324.3),
    }
    return ThroughputTable(
        tuple(
            ThroughputCell(context, clients, tok_s)
            for context, values in rows.items()
            for clients, tok_s in zip((1, 4, 16, 64), values, strict=True)
        )
    )


SPEC_THROUGHPUT = _spec_throughput()


def load_throughput(path: str | Path) -> ThroughputTable:
    return ThroughputTable.from_json(json.loads(Path(path).read_text()))


# --------------------------------------------------------------------------- plan


class ProvisioningCost(NamedTuple):
    model: str
    usd_per_hour: float
    usd_per_month: float
    usd_per_million_output_tokens: tuple[tuple[ThroughputCell, float], ...]


class RebuildEconomics(NamedTuple):
    """Spot preemption vs flex premium (SPEC 7)."""

    cold_s: float
    warm_s: float
    cold_usd: float
    warm_usd: float
    flex_premium_usd_per_hour: float
    break_even_cold_hours: float
    break_even_warm_hours: float


class ExpectedLoad(NamedTuple):
    clients: int
    context: int
    requested_tokens: int
    kv_capacity_tokens: int
    fits: bool
    max_clients: int
    output_tokens_per_s: float | None  # when the throughput table has that cell


class Plan(NamedTuple):
    geometry: ModelGeometry
    chip: ChipSpec
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    max_model_len: int
    tensor_parallel_size: int
    max_num_seqs: int
    kv_bytes_per_token: int
    kv_groups: tuple[KVGroup, ...]
    budget: HbmBudget
    kv_tokens: int
    block_size: int
    num_blocks: int
    max_model_len_fits: bool
    kv_wall: tuple[tuple[int, int], ...]  # (context, max clients)
    sliding_window_kv_gain: float | None
    weights: WeightsBreakdown
    decode_bytes_per_step: int
    decode_floor_s: float
    measured_tpot_ms: float | None
    throughput: ThroughputTable
    costs: tuple[ProvisioningCost, ...]
    hours_per_month: float
    rebuild: RebuildEconomics | None
    expected: ExpectedLoad | None
    # {provisioning model: PriceTag} of each priced model (plan --json's price_source etc.).
    price_sources: Mapping[str, PriceTag]

    @property
    def kv_block_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def blocks_per_request(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    @property
    def bandwidth_efficiency(self) -> float | None:
        if self.measured_tpot_ms is None:
            return None
        return bandwidth_efficiency(self.decode_floor_s, self.measured_tpot_ms / 1e3)

    def cost(self, model: str) -> ProvisioningCost | None:
        return next((c for c in self.costs if c.model == model), None)

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON (`tpuserve plan --json`), one helper per section."""
        return {
            "model": self._model_json(),
            "chip": self._chip_json(),
            "settings": self._settings_json(),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_breakdown": self._kv_breakdown_json(),
            "layers": self._layers_json(),
            **self._memory_json(),
            "weights_breakdown": self._weights_json(),
            **self._decode_json(),
            "throughput": self.throughput.to_json()["cells"],
            "hours_per_month": self.hours_per_month,
            "provisioning": self._provisioning_json(),
            "batching_gain": {
                str(context): self.throughput.batching_gain(context)
                for context in self.throughput.contexts
            },
            **self._rebuild_json(),
            "expected": None if self.expected is None else self.expected._asdict(),
        }

    def _model_json(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "num_hidden_layers": g.num_hidden_layers,
            "num_kv_shared_layers": g.num_kv_shared_layers,
            "sliding_layers": g.layer_types.count(SLIDING),
            "full_layers": g.layer_types.count(FULL),
            "num_attention_heads": g.num_attention_heads,
            "num_key_value_heads": g.num_key_value_heads,
            "head_dim": g.head_dim,
            "global_head_dim": g.global_head_dim,
            "sliding_window": g.sliding_window,
        }

    def _chip_json(self) -> dict[str, Any]:
        return {
            "name": self.chip.name,
            "chips": self.chip.chips,
            "hbm_visible_bytes": self.chip.hbm_visible_bytes,
            "hbm_bandwidth_bytes_per_s": self.chip.hbm_bandwidth_bytes_per_s,
            "peak_bf16_flops": self.chip.peak_bf16_flops,
        }

    def _settings_json(self) -> dict[str, Any]:
        return {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
        }

    def _kv_breakdown_json(self) -> list[dict[str, Any]]:
        return [
            {
                "attention": k.attention,
                "head_dim": k.head_dim,
                "cache_layers": k.cache_layers,
                "shared_layers": k.shared_layers,
                "padded_kv_heads": k.padded_kv_heads,
                "bytes_per_token": k.bytes_per_token,
            }
            for k in self.kv_groups
        ]

    def _layers_json(self) -> list[dict[str, Any]]:
        return [
            {
                "index": layer.index,
                "attention": layer.attention,
                "head_dim": layer.head_dim,
                "kv_source": layer.kv_source,
                "kv_bytes_per_token": layer_kv_bytes_per_token(
                    layer, tensor_parallel_size=self.tensor_parallel_size
                ),
            }
            for layer in self.geometry.layers
        ]

    def _memory_json(self) -> dict[str, Any]:
        """HBM budget, KV pool, blocks and the KV wall: top-level keys of to_json."""
        b = self.budget
        return {
            "hbm_visible_bytes": b.hbm_visible_bytes,
            "hbm_cap_bytes": b.cap_bytes,
            "weights_bytes": b.weights_bytes,
            "kv_pool_bytes": b.kv_pool_bytes,
            "ungoverned_bytes": b.ungoverned_bytes,
            "kv_tokens": self.kv_tokens,
            "block_size": self.block_size,
            "blocks_per_request": self.blocks_per_request,
            "num_blocks": self.num_blocks,
            "kv_block_tokens": self.kv_block_tokens,
            "max_model_len_fits": self.max_model_len_fits,
            "kv_wall": {str(context): clients for context, clients in self.kv_wall},
            "sliding_window_kv_gain": self.sliding_window_kv_gain,
        }

    def _weights_json(self) -> dict[str, Any]:
        w = self.weights
        return {
            "per_layer_embeddings_bytes": w.per_layer_embeddings,
            "embedding_bytes": w.embedding,
            "lm_head_bytes": w.lm_head,
            "attention_bytes": w.attention,
            "mlp_bytes": w.mlp,
            "explained_bytes": w.explained,
            "unexplained_bytes": w.unexplained,
        }

    def _decode_json(self) -> dict[str, Any]:
        """The decode bandwidth floor and what was measured against it: top-level keys."""
        return {
            "decode_bytes_per_step": self.decode_bytes_per_step,
            "decode_floor_ms": self.decode_floor_s * 1e3,
            "measured_tpot_ms": self.measured_tpot_ms,
            "bandwidth_efficiency": self.bandwidth_efficiency,
        }

    def _provisioning_json(self) -> dict[str, Any]:
        return {
            c.model: {
                "usd_per_hour": c.usd_per_hour,
                "usd_per_month": c.usd_per_month,
                "usd_per_million_output_tokens": {
                    cell.key: usd for cell, usd in c.usd_per_million_output_tokens
                },
                **{k: self.price_sources.get(c.model, UNSTATED_TAG)[k]
                   for k in ("price_source", "read_at", "sku")},
            }
            for c in self.costs
        }

    def _rebuild_json(self) -> dict[str, Any]:
        """Spot rebuild cost, flex premium and break-even (None without both prices)."""
        r = self.rebuild
        return {
            "rebuild_usd": None if r is None else {"cold": r.cold_usd, "warm": r.warm_usd},
            "flex_premium_usd_per_hour": None if r is None else r.flex_premium_usd_per_hour,
            "break_even_hours": None
            if r is None
            else {"cold": r.break_even_cold_hours, "warm": r.break_even_warm_hours},
        }

def build_plan(
    geometry: ModelGeometry,
    chip: ChipSpec = V5E,
    *,
    gpu_memory_utilization: float = GPU_MEM_CEILING,
    kv_cache_memory_bytes: int | None = None,
    max_model_len: int = 32768,
    tensor_parallel_size: int = 1,
    weights_bytes: int = E2B_WEIGHTS_BYTES,
    prices: Mapping[str, float] = DEFAULT_PRICES_USD_PER_CHIP_HOUR,
    throughput: ThroughputTable = SPEC_THROUGHPUT,
    expected_clients: int | None = None,
    expected_context: int | None = None,
    measured_tpot_ms: float | None = E2B_MEASURED_TPOT_MS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cold_start_s: float = COLD_START_S,
    warm_start_s: float = WARM_START_S,
    hours_per_month: float = HOURS_PER_MONTH,
    price_sources: Mapping[str, PriceTag] | None = None,
) -> Plan:
    """Everything SPEC 5-7 derives, for one deployment. Defaults are the SPEC deployment.
    `price_sources`: each price's {price_source, read_at, sku}; unset, SPEC 2's for the
    default prices, else each is said to be unstated."""
    _check_plan_arguments(chip, tensor_parallel_size, expected_clients, expected_context)
    groups = kv_breakdown(geometry, tensor_parallel_size=tensor_parallel_size)
    budget = hbm_budget(
        chip,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes=weights_bytes,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
    )
    contexts = sorted({*throughput.contexts, max_model_len, *filter(None, [expected_context])})
    kv = _kv_fields(geometry, groups, budget, contexts, max_model_len=max_model_len,
                    max_num_seqs=max_num_seqs, tensor_parallel_size=tensor_parallel_size)
    step_bytes = decode_bytes_per_step(geometry)
    return Plan(
        geometry=geometry,
        chip=chip,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        max_num_seqs=max_num_seqs,
        budget=budget,
        **kv,
        weights=weights_breakdown(geometry, weights_bytes),
        decode_bytes_per_step=step_bytes,
        decode_floor_s=decode_floor_s(step_bytes, chip),
        measured_tpot_ms=measured_tpot_ms,
        throughput=throughput,
        costs=_costs(prices, throughput, chip.chips, hours_per_month),
        hours_per_month=hours_per_month,
        rebuild=_rebuild(prices, chip.chips, cold_start_s, warm_start_s),
        price_sources=dict(price_sources) if price_sources is not None else (
            dict.fromkeys(prices, SPEC2_TAG) if prices is DEFAULT_PRICES_USD_PER_CHIP_HOUR
            else {}),
        expected=None
        if expected_clients is None or expected_context is None
        else _expected(
            expected_clients, expected_context, kv["num_blocks"], kv["block_size"], throughput
        ),
    )


def _check_plan_arguments(
    chip: ChipSpec,
    tensor_parallel_size: int,
    expected_clients: int | None,
    expected_context: int | None,
) -> None:
    if tensor_parallel_size > chip.chips:
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} needs {tensor_parallel_size} chips, "
            f"the slice has {chip.chips}"
        )
    if (expected_clients is None) != (expected_context is None):
        raise ValueError("give expected_clients and expected_context together")


def _kv_fields(
    geometry: ModelGeometry,
    groups: tuple[KVGroup, ...],
    budget: HbmBudget,
    contexts: list[int],
    *,
    max_model_len: int,
    max_num_seqs: int,
    tensor_parallel_size: int,
) -> dict[str, Any]:
    """The Plan's KV fields: bytes per token, the pool in Pallas blocks, the KV wall."""
    per_token = sum(g.bytes_per_token for g in groups)
    block = pallas_block_size(max_model_len, max_num_seqs=max_num_seqs)
    blocks = num_blocks(budget.kv_pool_bytes, block, per_token)
    return {
        "kv_bytes_per_token": per_token,
        "kv_groups": groups,
        "kv_tokens": kv_tokens(budget.kv_pool_bytes, per_token),
        "block_size": block,
        "num_blocks": blocks,
        "max_model_len_fits": fits_one_request(blocks * block, max_model_len),
        "kv_wall": tuple((c, kv_wall_clients(blocks, block, c)) for c in contexts),
        "sliding_window_kv_gain": sliding_window_kv_gain(
            geometry, max_model_len, tensor_parallel_size=tensor_parallel_size
        )
        if SLIDING in geometry.layer_types
        else None,
    }

def _costs(
    prices: Mapping[str, float], throughput: ThroughputTable, chips: int, hours_per_month: float
) -> tuple[ProvisioningCost, ...]:
    costs = []
    for model, per_chip in prices.items():
        per_hour = per_chip * chips
        costs.append(
            ProvisioningCost(
                model=model,
                usd_per_hour=per_hour,
                usd_per_month=cost_for_hours(per_hour, hours_per_month),
                usd_per_million_output_tokens=tuple(
                    (cell, usd_per_million_tokens(per_hour, cell.output_tokens_per_s))
                    for cell in throughput.cells
                ),
            )
        )
    return tuple(costs)


def _rebuild(
    prices: Mapping[str, float], chips: int, cold_s: float, warm_s: float
) -> RebuildEconomics | None:
    if SPOT not in prices or FLEX not in prices:
        return None
    spot, flex = prices[SPOT] * chips, prices[FLEX] * chips
    return RebuildEconomics(
        cold_s=cold_s,
        warm_s=warm_s,
        cold_usd=rebuild_cost_usd(spot, cold_s),
        warm_usd=rebuild_cost_usd(spot, warm_s),
        flex_premium_usd_per_hour=flex - spot,
        break_even_cold_hours=break_even_preemption_hours(cold_s, spot, flex),
        break_even_warm_hours=break_even_preemption_hours(warm_s, spot, flex),
    )


def _expected(
    clients: int, context: int, blocks: int, block: int, throughput: ThroughputTable
) -> ExpectedLoad:
    if clients <= 0 or context <= 0:
        raise ValueError("expected_clients and expected_context must be > 0")
    cell = throughput.get(context, clients)
    max_clients = kv_wall_clients(blocks, block, context)
    return ExpectedLoad(
        clients=clients,
        context=context,
        requested_tokens=clients * context,
        kv_capacity_tokens=blocks * block,
        fits=clients <= max_clients,
        max_clients=max_clients,
        output_tokens_per_s=None if cell is None else cell.output_tokens_per_s,
    )
