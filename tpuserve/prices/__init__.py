"""What a TPU chip-hour costs, per accelerator type, region and provisioning model, and where
each figure comes from.

The one interface the planner, the settings and the CLI read: `price_of`. Every answer is a
`Price` carrying its source (the `price_source` string `plan --placements --json` prints), the
date it was read and the Cloud Billing SKU when one is known. No answer (None) means no source
names a price there: callers say so, never guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR

SPEC2_SOURCE = "SPEC 2"
SPEC2_REGION = "us-west4"  # SPEC 2's prices are us-west4's (Cloud Billing Catalog, measured)


@dataclass(frozen=True)
class Price:
    """$/chip-hour of one (accelerator type, region, provisioning model), with its source."""

    usd_per_chip_hour: float
    # `catalog <date>`, `snapshot <source> <date>`, `pricing setting` or `SPEC 2`.
    source: str
    read_at: str  # YYYY-MM-DD the figure was read ("" where the source has no date)
    sku: str | None = None  # the Cloud Billing SKU id, where known


def price_of(accelerator_type: str, region: str, provisioning_model: str) -> Price | None:
    """The price of one chip-hour, or None where no source names one.

    Today: SPEC 2's measured v5e figures in us-west4 only (the shipped snapshot and the
    refreshed catalog file replace this body; the signature stays)."""
    if region != SPEC2_REGION or not accelerator_type.startswith("v5litepod-"):
        return None
    usd = PRICES_USD_PER_CHIP_HOUR.get(provisioning_model)
    return None if usd is None else Price(usd, SPEC2_SOURCE, "")
