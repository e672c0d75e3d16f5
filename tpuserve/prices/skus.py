"""Cloud Billing Catalog SKUs -> $/chip-hour of TPU v5e and v6e per region and provisioning
model (the Sku schema of cloudbilling.v1's discovery document).

What a TPU v5e/v6e SKU looks like, per SkyPilot's catalog fetcher (skypilot-org/skypilot,
sky/catalog/data_fetchers/fetch_gcp.py, which reads services 6F81-5844-456A (Compute Engine)
and E000-3F24-B8AA (Cloud TPU)): its description names `TpuV5e` / `TpuV6e`; its price is per
chip-hour; a spot SKU says "Preemptible" in its description while its category.usageType may
still be OnDemand. Here a description naming v5e or v6e is matched; spot is "Preemptible" or
"Spot" in the description or usageType Preemptible; flex-start is "Flex" / "DWS" in it; else
usageType OnDemand is on-demand; a commitment (Commit*) is not a provisioning model priced
here: skipped and counted, like every SKU that names no accelerator.

A matched SKU is read strictly: a missing or malformed field, a unit other than the hour, a
currency other than USD, a zero price or two SKUs disagreeing on one price is a `SkuRefused`
naming the SKU and the field (one line); nothing is guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuserve import kinds
from tpuserve.accelerators import ACCELERATORS, V5E, V6E, Family
from tpuserve.prices.table import MAX_USD_PER_CHIP_HOUR, Key

_FAMILIES: tuple[tuple[Family, re.Pattern[str]], ...] = (
    (V5E, re.compile(r"\btpu[\s-]?v5e\b|\bv5\s?lite", re.I)),
    (V6E, re.compile(r"\btpu[\s-]?v6e\b|\btrillium\b", re.I)),
)
_SPOT = re.compile(r"\b(preemptible|spot)\b", re.I)
_FLEX = re.compile(r"\b(flex[\s-]?start|dws|dynamic workload scheduler)\b", re.I)
_REGION = re.compile(r"[a-z]+(?:-[a-z]+)+\d{1,2}")
_SKU_ID = re.compile(r"[A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}")
_UNITS = re.compile(r"-?\d{1,19}")
SPOT, FLEX, ONDEMAND = kinds.SPOT.price_key, kinds.FLEX.price_key, kinds.ONDEMAND.price_key


class SkuRefused(ValueError):
    """A TPU SKU the refresh cannot read: which SKU, which field (one line)."""


@dataclass
class Parsed:
    """What a page of SKUs says: prices per (accelerator type, region, model), with SKUs."""

    prices: dict[Key, tuple[float, str]] = field(default_factory=dict)
    unmatched: int = 0  # SKUs that name no accelerator priced here
    commitments: int = 0  # TPU SKUs of a commitment, not a provisioning model priced here
    seen: int = 0


def _refuse(sku: Mapping[str, Any], why: str) -> SkuRefused:
    sid = sku.get("skuId")
    name = sid if isinstance(sid, str) and _SKU_ID.fullmatch(sid) else repr(str(sid)[:20])
    desc = sku.get("description")
    shown = repr(desc[:60]) if isinstance(desc, str) else "(no description)"
    return SkuRefused(f"SKU {name} {shown}: {why}")


def family_of(description: str) -> Family | None:
    return next((f for f, rx in _FAMILIES if rx.search(description)), None)


def _model(sku: Mapping[str, Any], description: str) -> str | None:
    category = sku.get("category")
    usage = category.get("usageType") if isinstance(category, dict) else None
    if not isinstance(usage, str) or not usage:
        raise _refuse(sku, "category.usageType is missing: OnDemand, Preemptible, Commit...?")
    if _SPOT.search(description) or usage == "Preemptible":
        return SPOT
    if _FLEX.search(description):
        return FLEX
    if usage == "OnDemand":
        return ONDEMAND
    if usage.startswith("Commit"):
        return None
    raise _refuse(sku, f"category.usageType = {usage[:30]!r}: not OnDemand, Preemptible or "
                  "a commitment")


def _regions(sku: Mapping[str, Any]) -> list[str]:
    regions = sku.get("serviceRegions")
    if not isinstance(regions, list) or not regions:
        raise _refuse(sku, "serviceRegions is missing or empty: a price of no region proves "
                      "nothing")
    bad = [r for r in regions if not isinstance(r, str) or not _REGION.fullmatch(r)]
    if bad:
        raise _refuse(sku, f"serviceRegions has {str(bad[0])[:30]!r}: not a region like "
                      "us-west4")
    return regions


def _unit_price(sku: Mapping[str, Any]) -> float:
    infos = sku.get("pricingInfo")
    if not isinstance(infos, list) or not infos or not all(isinstance(i, dict) for i in infos):
        raise _refuse(sku, "pricingInfo is missing or empty")
    # The latest pricing version (the API answers the current one without a time range).
    info = max(infos, key=lambda i: str(i.get("effectiveTime", "")))
    expr = info.get("pricingExpression")
    if not isinstance(expr, dict):
        raise _refuse(sku, "pricingInfo[].pricingExpression is missing")
    if expr.get("usageUnit") != "h":
        raise _refuse(sku, f"pricingExpression.usageUnit = {str(expr.get('usageUnit'))[:20]!r}: "
                      "not 'h' (a price per chip-hour)")
    rates = expr.get("tieredRates")
    first = [r for r in rates if isinstance(r, dict) and not r.get("startUsageAmount")] \
        if isinstance(rates, list) else []
    if len(first) != 1:
        raise _refuse(sku, "pricingExpression.tieredRates has no single first tier "
                      "(startUsageAmount 0)")
    money = first[0].get("unitPrice")
    if not isinstance(money, dict):
        raise _refuse(sku, "tieredRates[].unitPrice is missing")
    if money.get("currencyCode", "USD") != "USD":
        raise _refuse(sku, f"unitPrice.currencyCode = {str(money.get('currencyCode'))[:8]!r}: "
                      "not USD")
    units, nanos = money.get("units", "0"), money.get("nanos", 0)
    if isinstance(units, int) and not isinstance(units, bool):
        units = str(units)
    if not isinstance(units, str) or not _UNITS.fullmatch(units):
        raise _refuse(sku, f"unitPrice.units = {str(units)[:20]!r}: not an int64 decimal")
    if isinstance(nanos, bool) or not isinstance(nanos, int) or not -10**9 < nanos < 10**9:
        raise _refuse(sku, f"unitPrice.nanos = {str(nanos)[:20]!r}: not an int32 below 1e9")
    usd = int(units) + nanos / 1e9
    if not 0 < usd <= MAX_USD_PER_CHIP_HOUR:
        raise _refuse(sku, f"unitPrice = {usd:g} USD/h: outside (0, {MAX_USD_PER_CHIP_HOUR:g}] "
                      "$/chip-hour")
    return round(usd, 9)


def parse_skus(skus: Iterable[Any], into: Parsed | None = None) -> Parsed:
    """Read SKUs into per-accelerator prices; a TPU v5e/v6e price per chip-hour applies to every
    slice of the family (tpuserve/accelerators.py), as the Catalog prices chips, not slices."""
    out = into or Parsed()
    for sku in skus:
        out.seen += 1
        if not isinstance(sku, dict):
            raise SkuRefused(f"SKU #{out.seen}: not a JSON object")
        desc = sku.get("description")
        if not isinstance(desc, str):
            raise _refuse(sku, "description is missing")
        family = family_of(desc)
        if family is None:
            out.unmatched += 1
            continue
        sid = sku.get("skuId")
        if not isinstance(sid, str) or not _SKU_ID.fullmatch(sid):
            raise _refuse(sku, "skuId is missing or not an id like 1A2B-3C4D-5E6F")
        model = _model(sku, desc)
        if model is None:
            out.commitments += 1
            continue
        usd = _unit_price(sku)
        for region in _regions(sku):
            for accel in (a for a in ACCELERATORS.values() if a.family is family):
                key = (accel.accelerator_type, region, model)
                had = out.prices.get(key)
                if had is not None and had[0] != usd:
                    raise _refuse(sku, f"prices {family.name} {model} in {region} at {usd:g} "
                                  f"$/chip-hour, SKU {had[1]} at {had[0]:g}: which one bills "
                                  "is not known here")
                out.prices.setdefault(key, (usd, sid))
    return out
