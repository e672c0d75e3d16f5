"""Told at synth: another region offers the deployment's accelerator under the same
provisioning model for less (both prices with their sources, tpuserve/prices)."""

from __future__ import annotations

from tpuserve.prices import prices_by_region, region_of
from tpuserve.settings.deployment import Deployment
from tpuserve.zones import offered


def cheaper_elsewhere(d: Deployment) -> list[str]:
    """One warning per provisioning model the stack bills under whose cheapest priced region
    (among those with a zone known to offer the pair, tpuserve/zones.py) is not its own. A
    price that stands in for a missing one (settings/warnings.py says so) is not compared."""
    out = []
    accel = d.tpu.accelerator_type
    for key in d.price_keys:
        if key not in d.pricing.model_fields_set and d.book_price(key) is None:
            continue
        here = d.price_for(key)
        zones: dict[str, str] = {}
        for zone in offered(accel, key):
            zones.setdefault(region_of(zone), zone)  # the first known zone of each region
        cheaper = sorted(
            (p.usd_per_chip_hour, region, p)
            for region, p in prices_by_region(accel, key,
                                              catalog_file=d.pricing.catalog_path).items()
            if region in zones and region != d.region
            and p.usd_per_chip_hour < here.usd_per_chip_hour)
        if not cheaper:
            continue
        usd, region, there = cheaper[0]
        out.append(
            f"pricing.{key}: {accel} {key} costs ${usd:.4f}/chip-hour in {region} "
            f"({there.source}) against ${here.usd_per_chip_hour:.4f} here in {d.region} "
            f"({here.source}); a base is regional, so a second deployment (its own config file "
            f"with its own gcp.deployment, and the zone {zones[region]}) puts a stack there "
            "(README, 'Prices and another region')")
    return out
