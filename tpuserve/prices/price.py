"""One price and where it comes from (the type every price table holds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# The source strings `plan --placements --json` prints as price_source (besides
# `catalog <date>` and `snapshot <source> <date>`, which carry their dates).
SPEC2_SOURCE = "SPEC 2"
SETTING_SOURCE = "pricing setting"
# Where no source prices a chip-hour, [pricing]'s default (SPEC 2's v5e us-west4 figure) stands
# in: its source says so, so no table or line shows it as SPEC 2's price of that chip there.
STANDIN_PREFIX = "stand-in: "
# SPEC 2 measured v5e's $/chip-hour in us-west4 on v5litepod-1: a larger v5e slice bills the
# same per chip (the Catalog's TPU SKUs are per chip), so its slice-hour is chips x that.
SPEC2_MEASURED_ON = "v5litepod-1"


def standin_source(accelerator_type: str, provisioning_model: str, region: str) -> str:
    """The source of [pricing]'s default standing in where no source prices the chip-hour."""
    return (f"{STANDIN_PREFIX}SPEC 2's v5e us-west4 figure, no source prices "
            f"{accelerator_type} {provisioning_model} in {region}")


def spec2_source(accelerator_type: str, chips: int, *, measured_on: str = SPEC2_MEASURED_ON,
                 source: str = SPEC2_SOURCE) -> str:
    """A measured per-chip price's source string: `SPEC 2` on the slice it was measured on
    (v5litepod-1), else `SPEC 2 (per chip, x4 derived)`: the per-chip figure is measured, the
    slice-hour derived from it (chips x that)."""
    if accelerator_type == measured_on:
        return source
    return f"{source} (per chip, x{chips} derived)"


class Price(NamedTuple):
    """$/chip-hour of one (accelerator type, region, provisioning model), with its source."""

    usd_per_chip_hour: float
    # `catalog <date>`, `snapshot <source> <date>`, `pricing setting`, `SPEC 2` (or `SPEC 2
    # (...derived...)` on a larger v5e slice) or `stand-in: ...` (no source prices it).
    source: str
    read_at: str  # YYYY-MM-DD the figure was read ("" where the source has no date)
    sku: str | None = None  # the Cloud Billing SKU id, where known

    @property
    def standin(self) -> bool:
        """No source prices this chip-hour: [pricing]'s default stands in (see standin_source)."""
        return self.source.startswith(STANDIN_PREFIX)


def sources_line(prices: Mapping[str, Price]) -> str:
    """plan --json's `sources.prices`: each priced provisioning model's source, models of one
    source together. `measured SPEC 2 ...` only where SPEC 2 measured every one of them (a
    line the text plan, which prints only what is not measured, leaves out)."""
    if not prices:
        return "none: no source prices this accelerator in this region"
    if all(p.source == SPEC2_SOURCE for p in prices.values()):
        return (f"measured SPEC 2 ({', '.join(prices)}: v5e's $/chip-hour in us-west4, "
                "Cloud Billing Catalog)")
    by: dict[str, list[str]] = {}
    for model, p in prices.items():
        by.setdefault(p.source + (f", SKU {p.sku}" if p.sku else ""), []).append(model)
    return "; ".join(f"{', '.join(models)}: {source}" for source, models in by.items())
