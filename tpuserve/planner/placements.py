"""Every placement of the configured model compared: for each accelerator of the table, each
zone the zones table OFFERS it in and each TPU VM provisioning model, what an hour costs, the
output tokens/s it is expected to serve and the $ per million output tokens, at
capacity.expected_context x expected_clients (`tpuserve plan --placements`).

A placement lists a figure as measured only where it was measured (docs/measurements.md):
Gemma 4 E2B's SPEC 6 throughput on v5litepod-1 at a measured cell, SPEC 2's prices (or a Cloud
Billing Catalog read), SPEC 1's zone verdicts. A figure read from a vendor's page or a third
party's catalog (the shipped snapshot's prices, Google's flex-start zones) is named in the
entry's `vendor` list; a user's [pricing] figure in `setting`; a figure computed here in
`derived`, with the rule it is derived by in `sources`. A throughput is derived by
scaling the reference's measured point by the bytes a decode step moves (the streamed weights
plus the KV read at the cell) over the slice's HBM bandwidth (planner/throughput.py, which
`plan` derives its table with too).

A slice the model does not fit, or whose tensor parallelism cannot work, is skipped with its
reason; a placement no price source names is listed apart (`unpriced`), never priced by guess;
a region a source prices where no source names a zone offering the slice is listed apart too
(`no_zone`): every priced region is shown, none dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tpuserve import kinds
from tpuserve.accelerators import ACCELERATORS, Accelerator
from tpuserve.facts import GiB
from tpuserve.planner.arithmetic import ChipSpec, ModelGeometry, usd_per_million_tokens
from tpuserve.planner.throughput import (
    Reference,
    Throughput,
    geometry_of,
    spec6_reference,
    throughput,
)
from tpuserve.prices import SPEC2_SOURCE, Price, price_of, prices_by_region, region_of
from tpuserve.settings.accelerator_rules import memory_ceiling, tp_problems
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_inputs import model_inputs
from tpuserve.zones import Offer, offered, zone_fact

PriceFn = Callable[[str, str, str], "Price | None"]
RegionsFn = Callable[[str, str], Iterable[str]]  # (accelerator, model) -> the regions priced

# The load the figures are for when capacity.expected_context / expected_clients are unset.
DEFAULT_CONTEXT, DEFAULT_CLIENTS = 1024, 16
PRICING_SETTING = "pricing setting"  # the price_source of a user-set [pricing] key
# The TPU VM kinds a placement may be (the fleet's pools are GKE's: not a zone of this table).
VM_KINDS: tuple[kinds.Kind, ...] = tuple(k for k in kinds.KINDS if not k.on_gke)
_FLEX_MODEL = kinds.FLEX.provisioning_model


@dataclass(frozen=True)
class Placement:
    accelerator_type: str
    zone: str
    region: str
    provisioning_model: str
    tensor_parallel_size: int
    usd_per_hour: float
    output_tokens_per_second: float
    usd_per_million_tokens: float
    kv_tokens: int
    kv_wall_clients: int  # most clients of expected_context the KV pool holds at once
    fits_kv_wall: bool  # expected_clients <= kv_wall_clients
    flex_start_accepted: bool
    derived: tuple[str, ...]  # computed here
    price_source: str
    sources: dict[str, str] = field(default_factory=dict)
    vendor: tuple[str, ...] = ()  # read from a vendor's page or a third party's catalog
    setting: tuple[str, ...] = ()  # the user's [pricing] figure

    def as_json(self) -> dict[str, Any]:
        return {
            "accelerator_type": self.accelerator_type, "zone": self.zone, "region": self.region,
            "provisioning_model": self.provisioning_model,
            "tensor_parallel_size": self.tensor_parallel_size,
            "usd_per_hour": self.usd_per_hour,
            "output_tokens_per_second": self.output_tokens_per_second,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "kv_tokens": self.kv_tokens, "kv_wall_clients": self.kv_wall_clients,
            "fits_kv_wall": self.fits_kv_wall,
            "flex_start_accepted": self.flex_start_accepted,
            "derived": list(self.derived), "vendor": list(self.vendor),
            "setting": list(self.setting), "price_source": self.price_source,
            "sources": dict(self.sources),
        }


@dataclass(frozen=True)
class Unpriced:
    """A placement the model fits and the zone offers, but no price source names."""

    accelerator_type: str
    zone: str
    region: str
    provisioning_model: str
    why: str


@dataclass(frozen=True)
class NoZone:
    """A region a price source names for the slice, where no source names a zone offering it
    (tpuserve/zones.py): priced, but not placeable until a zone is known."""

    accelerator_type: str
    region: str
    provisioning_model: str
    price_source: str
    why: str


@dataclass(frozen=True)
class Skipped:
    """An accelerator the configured model cannot serve on, and why (one line)."""

    accelerator_type: str
    why: str


@dataclass(frozen=True)
class Placements:
    model: str
    context: int
    clients: int
    placements: tuple[Placement, ...]
    unpriced: tuple[Unpriced, ...]
    skipped: tuple[Skipped, ...]
    reference: str
    no_zone: tuple[NoZone, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "expected_context": self.context,
            "expected_clients": self.clients, "throughput_reference": self.reference,
            "placements": [p.as_json() for p in self.placements],
            "unpriced": [vars(u) for u in self.unpriced],
            "skipped": [vars(s) for s in self.skipped],
            "no_zone": [vars(n) for n in self.no_zone],
        }


def expected_load(d: Deployment) -> tuple[int, int]:
    """(context, clients) the figures are for: the capacity settings, else 1024 x 16."""
    c = d.capacity
    if c.expected_context is None or c.expected_clients is None:
        return DEFAULT_CONTEXT, DEFAULT_CLIENTS
    return c.expected_context, c.expected_clients


def price_measured(price: Price) -> bool:
    """SPEC 2's prices and a Catalog read are Google's own rates read from the Billing
    Catalog (measured); a snapshot of another source or a user's setting is not."""
    return price.source.startswith((SPEC2_SOURCE, "catalog ")) or (
        price.source.startswith("snapshot ") and SPEC2_SOURCE in price.source)


MEASURED, VENDOR, SETTING, DERIVED = "measured", "vendor", "setting", "derived"


def price_label(price: Price, chips: int) -> str:
    """How sure a slice's $/h is: measured (SPEC 2, a Catalog read) or the user's setting for
    one chip; the snapshot's source's own per-slice figure is a third party's (vendor); a
    per-chip rate times the chips is computed here (derived)."""
    if price.source.startswith("snapshot ") and SPEC2_SOURCE not in price.source:
        return VENDOR  # the source's per-slice price, whatever the slice
    if chips != 1:
        return DERIVED
    if price.source == PRICING_SETTING:
        return SETTING
    return MEASURED if price_measured(price) else VENDOR


def with_pricing_settings(d: Deployment, price: PriceFn) -> PriceFn:
    """`price` with the user's [pricing] keys over it, for the deployment's own accelerator in
    its own region only (a setting names one rate: it says nothing of another chip or region)."""
    own = {k: getattr(d.pricing, k) for k in d.pricing.model_fields_set}

    def priced(accelerator_type: str, region: str, provisioning_model: str) -> Price | None:
        key = kinds.by_model(provisioning_model).price_key
        if (accelerator_type == d.tpu.accelerator_type and region == d.gcp.region
                and key in own):
            return Price(float(own[key]), PRICING_SETTING, "")
        return price(accelerator_type, region, provisioning_model)

    return priced


def _utilization(d: Deployment, a: Accelerator) -> float:
    """The memory fraction a slice is planned at: its own ceiling when the deployment runs at
    its slice's ceiling (the default), else the configured value, never above the ceiling."""
    ceiling = memory_ceiling(a).value
    configured = d.vllm.gpu_memory_utilization
    if configured == memory_ceiling(d.tpu.accelerator).value:
        return ceiling
    return min(configured, ceiling)


@dataclass(frozen=True)
class _Fit:
    """What one accelerator serves the model at: its plan's figures at the cell."""

    accelerator: Accelerator
    tp: int
    kv_tokens: int
    kv_wall_clients: int
    tok_s: Throughput
    kv_source: str


def _fit(d: Deployment, a: Accelerator, geometry: ModelGeometry, ref: Reference,
         context: int, clients: int) -> _Fit | Skipped:
    tp = a.chips  # a TPU VM's one vLLM server takes every chip (settings/accelerator_rules.py)
    name = a.accelerator_type
    problems = tp_problems(d.vllm.model_copy(update={"tensor_parallel_size": tp}), geometry,
                           "the model's geometry")
    if problems:
        return Skipped(name, f"{name}: {problems[0]}")
    one = ChipSpec(name=name, hbm_visible_bytes=a.family.hbm_visible_bytes,
                   hbm_bandwidth_bytes_per_s=a.family.hbm_bandwidth_bytes_per_s,
                   peak_bf16_flops=a.family.peak_bf16_flops, chips=a.chips)
    utilization = _utilization(d, a)
    ceiling = memory_ceiling(a)
    why = ceiling.source if utilization == ceiling.value else "vllm.gpu_memory_utilization"
    own = name == d.tpu.accelerator_type  # a fixed KV pool is the configured slice's alone
    try:
        plan = plan_for(d, geometry=geometry, chip=one, tensor_parallel_size=tp,
                        gpu_memory_utilization=utilization,
                        kv_cache_memory_bytes=d.vllm.kv_cache_memory_bytes if own else None,
                        expected_clients=clients, expected_context=context)
    except ValueError as exc:  # hbm_budget: the weights leave no KV pool under the cap
        if own and d.vllm.kv_cache_memory_bytes is not None:
            return Skipped(name, f"{name}: vllm.kv_cache_memory_bytes does not fit ({exc})")
        cap = one.total_hbm_bytes * utilization / GiB
        weights = (model_inputs(d).weights_bytes or 0) / GiB
        return Skipped(name, (
            f"{name}: the {weights:.2f} GiB of weights leave no KV pool under its "
            f"{cap:.2f} GiB cap ({one.chips} x {a.family.hbm_visible_gib:g} GiB visible x "
            f"gpu_memory_utilization {utilization}; SPEC 5: HBM budget)"))
    if not plan.max_model_len_fits:
        return Skipped(name, (
            f"{name}: one request of vllm.max_model_len = {d.vllm.max_model_len:,} needs that "
            f"many KV tokens but the pool holds {plan.kv_block_tokens:,}; the server would "
            "refuse to start (SPEC 5: HBM budget)"))
    assert plan.expected is not None  # expected_* were given
    return _Fit(a, tp, plan.kv_tokens, plan.expected.max_clients,
                throughput(ref, d.vllm.model, geometry, a, tp, context, clients),
                (f"derived: the HBM budget at gpu_memory_utilization {utilization} ({why}) "
                 f"minus the weights, over {plan.kv_bytes_per_token:,} B/token at TP {tp} "
                 "(SPEC 5 arithmetic)"))


def _fact_label(source: str) -> str:
    """A zone verdict's label: SPEC n's are measured; a Google page's or a catalog's, vendor."""
    return MEASURED if source.startswith("SPEC") else VENDOR


def _flex_fact(accelerator_type: str, zone: str) -> tuple[bool, str, str]:
    """(flex-start accepted, its source, its label) for one zone. No source: taken as not
    accepted (fail closed), a conclusion drawn here, so derived."""
    fact = zone_fact(accelerator_type, _FLEX_MODEL, zone)
    if fact.state is Offer.UNKNOWN:
        return False, ("derived: no source names flex-start there, taken as not accepted "
                       "(docs/accelerators.md)"), DERIVED
    return fact.state is Offer.OFFERED, fact.source, _fact_label(fact.source)


def _placement(f: _Fit, zone: str, kind: kinds.Kind, price: Price, clients: int) -> Placement:
    a = f.accelerator
    usd_per_hour = price.usd_per_chip_hour * a.chips
    flex, flex_source, flex_label = _flex_fact(a.accelerator_type, zone)
    zone_source = offered(a.accelerator_type, kind.provisioning_model)[zone]
    labels = {
        "zone": _fact_label(zone_source),
        "tensor_parallel_size": MEASURED if a.measured else DERIVED,
        "usd_per_hour": price_label(price, a.chips),
        "output_tokens_per_second": MEASURED if f.tok_s.measured else DERIVED,
        # SPEC 7: every $/token figure is derived from the prices and the rates.
        "usd_per_million_tokens": DERIVED,
        # SPEC 5: the pool's bytes are measured, its tokens derived from the geometry.
        "kv_tokens": DERIVED,
        "kv_wall_clients": DERIVED,
        "flex_start_accepted": flex_label,
    }
    tp_source = ("measured SPEC 4 (TP 1 on v5litepod-1)" if a.measured else
                 f"derived: the {a.chips} chips of {a.accelerator_type} "
                 "(settings/accelerator_rules.py)")
    chips = "" if a.chips == 1 else f" x {a.chips} chips"
    return Placement(
        accelerator_type=a.accelerator_type, zone=zone, region=region_of(zone),
        provisioning_model=kind.provisioning_model, tensor_parallel_size=f.tp,
        usd_per_hour=usd_per_hour, output_tokens_per_second=f.tok_s.tok_s,
        usd_per_million_tokens=usd_per_million_tokens(usd_per_hour, f.tok_s.tok_s),
        kv_tokens=f.kv_tokens, kv_wall_clients=f.kv_wall_clients,
        fits_kv_wall=clients <= f.kv_wall_clients, flex_start_accepted=flex,
        derived=tuple(k for k, v in labels.items() if v == DERIVED),
        vendor=tuple(k for k, v in labels.items() if v == VENDOR),
        setting=tuple(k for k, v in labels.items() if v == SETTING),
        price_source=price.source,
        sources={
            "zone": zone_source,
            "tensor_parallel_size": tp_source,
            "usd_per_hour": f"${price.usd_per_chip_hour:g}/chip-hour ({price.source}"
                            + (f", SKU {price.sku}" if price.sku else "") + f"){chips}",
            "output_tokens_per_second": f.tok_s.source,
            "usd_per_million_tokens": "derived: usd_per_hour / (output_tokens_per_second x "
                                      "3600) x 1e6 (SPEC 7)",
            "kv_tokens": f.kv_source,
            "kv_wall_clients": "derived: KV blocks / blocks per request of expected_context",
            "flex_start_accepted": flex_source,
        },
    )


def _sort_key(p: Placement) -> tuple[float, float, str, str, str]:
    return (p.usd_per_million_tokens, p.usd_per_hour, p.accelerator_type, p.zone,
            p.provisioning_model)


def book_prices(d: Deployment) -> tuple[PriceFn, RegionsFn]:
    """tpuserve.prices as the deployment reads it: with its [pricing] catalog_file (None: the
    default cache path), as Deployment.book_price does."""
    path = d.pricing.catalog_path

    def price(accelerator_type: str, region: str, provisioning_model: str) -> Price | None:
        return price_of(accelerator_type, region, provisioning_model, catalog_file=path)

    def regions(accelerator_type: str, provisioning_model: str) -> Iterable[str]:
        return prices_by_region(accelerator_type, provisioning_model, catalog_file=path)

    return price, regions


def _usable(p: Price | None) -> Price | None:
    """Fail closed: a rate that is no positive number, or has no source, prices nothing."""
    if p is None or not (math.isfinite(p.usd_per_chip_hour) and p.usd_per_chip_hour > 0
                         and p.source):
        return None
    return p


def _no_zone(accelerator_type: str, kind: kinds.Kind, zoned: set[str], regions: RegionsFn,
             price: PriceFn) -> list[NoZone]:
    """The regions a source prices the pair in where no source names a zone offering it."""
    out = []
    for region in sorted(set(regions(accelerator_type, kind.provisioning_model)) - zoned):
        p = _usable(price(accelerator_type, region, kind.provisioning_model))
        if p is not None:
            out.append(NoZone(accelerator_type, region, kind.provisioning_model, p.source, (
                f"{p.source} prices {accelerator_type} {kind.title} in {region}, but no source "
                "names a zone there offering it (tpuserve/zones.py)")))
    return out


def build_placements(d: Deployment, *, price: PriceFn | None = None,
                     regions: RegionsFn | None = None, reference: Reference | None = None,
                     accelerators: Iterable[Accelerator] | None = None) -> Placements:
    """Every placement of the deployment's model, cheapest $/M output tokens first.

    `price` / `regions`: the price of one chip-hour, and the regions a source prices a pair
    in (default: tpuserve.prices with the deployment's catalog_file; tests inject tables)."""
    book_price, book_regions = book_prices(d)
    geometry = geometry_of(d)
    ref = reference or spec6_reference()
    context, clients = expected_load(d)
    priced_by = with_pricing_settings(d, price or book_price)
    regions_of = regions or (book_regions if price is None else (lambda a, m: ()))
    placed: list[Placement] = []
    unpriced: list[Unpriced] = []
    skipped: list[Skipped] = []
    no_zone: list[NoZone] = []
    for a in ACCELERATORS.values() if accelerators is None else accelerators:
        fit = _fit(d, a, geometry, ref, context, clients)
        if isinstance(fit, Skipped):
            skipped.append(fit)
            continue
        for kind in VM_KINDS:
            zones = offered(a.accelerator_type, kind.provisioning_model)
            no_zone.extend(_no_zone(a.accelerator_type, kind, {region_of(z) for z in zones},
                                    regions_of, priced_by))
            for zone in zones:
                region = region_of(zone)
                p = _usable(priced_by(a.accelerator_type, region, kind.provisioning_model))
                if p is None:
                    unpriced.append(Unpriced(
                        a.accelerator_type, zone, region, kind.provisioning_model,
                        f"no price source names {a.accelerator_type} {kind.title} in {region} "
                        "(docs/planner.md: where prices come from)"))
                    continue
                placed.append(_placement(fit, zone, kind, p, clients))
    return Placements(d.vllm.model, context, clients, tuple(sorted(placed, key=_sort_key)),
                      tuple(unpriced), tuple(skipped), ref.source, tuple(no_zone))
