"""What a TPU chip-hour costs, per accelerator type, region and provisioning model, and where
each figure comes from.

The one interface the planner, the settings and the CLI read: `price_of`. Every answer is a
`Price` carrying its source (the `price_source` string `plan --placements --json` prints), the
date it was read and the Cloud Billing SKU when one is known. No answer (None) means no source
names a price there: callers say so, never guess.

Precedence, first answer wins ([pricing] keys the user sets stand above all of these: the
deployment's, tpuserve/settings/deployment.py):
1. the file `tpuserve prices refresh` wrote from the Cloud Billing Catalog (`[pricing]
   catalog_file`, else ~/.cache/tpuserve/prices.json), while younger than 30 days;
2. the shipped snapshot (snapshot.json: a public copy of the Catalog, with its source and date;
   SPEC 2's measured per-chip figures stand over it for every v5e slice in us-west4);
3. SPEC 2: Cloud TPU v5e's per-chip prices measured in us-west4.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tpuserve.accelerators import ACCELERATORS
from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR
from tpuserve.prices.price import (
    SETTING_SOURCE,
    SPEC2_SOURCE,
    STANDIN_PREFIX,
    Price,
    sources_line,
    spec2_source,
    standin_source,
)
from tpuserve.prices.table import (
    MODELS,
    PriceFileError,
    Table,
    catalog_read_at,
    default_catalog_file,
    load_catalog,
    region_of,
    snapshot,
)

SPEC2_REGION = "us-west4"  # SPEC 2's prices are us-west4's (Cloud Billing Catalog, measured)
SPEC2_FAMILY_PREFIX = "v5litepod-"  # ... and Cloud TPU v5e's, per chip
CATALOG_MAX_AGE_DAYS = 30  # an older refreshed file is not used (prices change)

__all__ = ["CATALOG_MAX_AGE_DAYS", "MODELS", "SETTING_SOURCE", "SPEC2_REGION", "SPEC2_SOURCE",
           "STANDIN_PREFIX", "Price", "PriceFileError", "catalog_age_days",
           "default_catalog_file", "price_of", "prices_by_region", "region_of",
           "sources_line", "standin_source"]


def _now(now: dt.datetime | None) -> dt.datetime:
    return dt.datetime.now(dt.UTC) if now is None else now.astimezone(dt.UTC)


def catalog_age_days(catalog_file: Path | None = None, *,
                     now: dt.datetime | None = None) -> float | None:
    """Days since the refreshed file was read from the Catalog; None without a file (an
    unset catalog_file whose default path does not exist). A file that is named but missing
    or malformed raises PriceFileError (one line): it proves nothing, and is not skipped."""
    path = catalog_file or default_catalog_file()
    if catalog_file is None and not path.exists():
        return None
    age = (_now(now) - catalog_read_at(path)).total_seconds() / 86400
    if age < -1:  # a clock a little off is not a future file; a day is
        raise PriceFileError(path, "read_at", f"in the future ({-age:.1f} days ahead of "
                             "this machine's clock)")
    return age


def _catalog(catalog_file: Path | None, now: dt.datetime | None) -> Table:
    age = catalog_age_days(catalog_file, now=now)
    if age is None or age >= CATALOG_MAX_AGE_DAYS:
        return {}
    return load_catalog(catalog_file or default_catalog_file())


def _spec2(accelerator_type: str, region: str, provisioning_model: str) -> Price | None:
    if region != SPEC2_REGION or not accelerator_type.startswith(SPEC2_FAMILY_PREFIX):
        return None
    usd = PRICES_USD_PER_CHIP_HOUR.get(provisioning_model)
    # read_at "": SPEC 2 dates its log by month only (docs/prices.md, "SPEC 2's date").
    a = ACCELERATORS.get(accelerator_type)
    return None if usd is None or a is None else Price(
        usd, spec2_source(accelerator_type, a.chips), "")


def price_of(accelerator_type: str, region: str, provisioning_model: str, *,
             catalog_file: Path | None = None, now: dt.datetime | None = None) -> Price | None:
    """The price of one chip-hour, or None where no source names one.

    `catalog_file`: [pricing] catalog_file (None: ~/.cache/tpuserve/prices.json if it
    exists); `now`: the clock the file's age is taken against (tests pin it)."""
    key = (accelerator_type, region, provisioning_model)
    for table in (_catalog(catalog_file, now), snapshot()):
        if key in table:
            return table[key]
    return _spec2(accelerator_type, region, provisioning_model)


def prices_by_region(accelerator_type: str, provisioning_model: str, *,
                     catalog_file: Path | None = None,
                     now: dt.datetime | None = None) -> dict[str, Price]:
    """Every region some source prices the pair in, with `price_of`'s answer there."""
    regions = {r for table in (_catalog(catalog_file, now), snapshot())
               for (a, r, m) in table if (a, m) == (accelerator_type, provisioning_model)}
    if _spec2(accelerator_type, SPEC2_REGION, provisioning_model) is not None:
        regions.add(SPEC2_REGION)
    out = {r: price_of(accelerator_type, r, provisioning_model, catalog_file=catalog_file,
                       now=now) for r in sorted(regions)}
    return {r: p for r, p in out.items() if p is not None}
