"""One price and where it comes from (the type every price table holds)."""

from __future__ import annotations

from dataclasses import dataclass

# The source strings `plan --placements --json` prints as price_source (besides
# `catalog <date>` and `snapshot <source> <date>`, which carry their dates).
SPEC2_SOURCE = "SPEC 2"
SETTING_SOURCE = "pricing setting"


@dataclass(frozen=True)
class Price:
    """$/chip-hour of one (accelerator type, region, provisioning model), with its source."""

    usd_per_chip_hour: float
    # `catalog <date>`, `snapshot <source> <date>`, `pricing setting` or `SPEC 2`.
    source: str
    read_at: str  # YYYY-MM-DD the figure was read ("" where the source has no date)
    sku: str | None = None  # the Cloud Billing SKU id, where known
