"""The price tables `price_of` reads, each figure with its source: the shipped snapshot
(snapshot.json beside this file) and the file `tpuserve prices refresh` writes.

Both are read as hostile input: a field of the wrong type, a price outside (0, 100] $/chip-hour,
an accelerator or provisioning model this project does not price, or a date that is not one is
a `PriceFileError` naming the file, the entry and the field (one line), never a guess.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tpuserve import kinds
from tpuserve.accelerators import ACCELERATORS
from tpuserve.prices.price import Price, spec2_source

SNAPSHOT = Path(__file__).with_name("snapshot.json")
FILE_FORMAT = "tpuserve-prices/1"
MODELS = kinds.PRICE_KEYS  # the provisioning models a chip-hour is priced under
# The snapshot's two price columns (the source's Price and SpotPrice), by the kinds' keys.
_COLUMNS = (kinds.ONDEMAND.price_key, kinds.SPOT.price_key)
# The bound of [pricing] too: SPEC 2's prices are 0.58-1.20; 100 catches a price per month.
MAX_USD_PER_CHIP_HOUR = 100.0
_REGION = re.compile(r"[a-z]+(?:-[a-z]+)+\d{1,2}")
_SKU = re.compile(r"[A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}")

Key = tuple[str, str, str]  # (accelerator type, region, provisioning model)
Table = Mapping[Key, Price]


class PriceFileError(ValueError):
    """A price file that cannot be read or that does not say what it claims (one line)."""

    def __init__(self, path: Path, where: str, why: str) -> None:
        self.path, self.where, self.why = path, where, why
        super().__init__(f"price file {str(path)[:200]!r}: {where}: {why}")


def region_of(zone: str) -> str:
    """A zone's region (`us-west4-a` -> `us-west4`): the Catalog prices per region."""
    return zone.rsplit("-", 1)[0]


def _fail(path: Path, where: str, why: str) -> PriceFileError:
    return PriceFileError(path, where, why)


def _usd(path: Path, where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(path, where, f"usd_per_chip_hour = {str(value)[:40]!r}: not a number")
    if not 0 < value <= MAX_USD_PER_CHIP_HOUR:
        raise _fail(path, where, f"usd_per_chip_hour = {value}: outside (0, "
                    f"{MAX_USD_PER_CHIP_HOUR:g}] $/chip-hour (a price per slice or per month?)")
    return float(value)


def _key(path: Path, where: str, accel: object, region: object, model: object) -> Key:
    if accel not in ACCELERATORS:
        raise _fail(path, where, f"accelerator_type = {str(accel)[:40]!r}: not one of "
                    f"{', '.join(ACCELERATORS)}")
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise _fail(path, where, f"region = {str(region)[:40]!r}: not a region like us-west4")
    if model not in MODELS:
        raise _fail(path, where, f"provisioning_model = {str(model)[:40]!r}: not one of "
                    f"{', '.join(MODELS)}")
    return str(accel), region, str(model)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(path, "read", f"cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, "read", f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise _fail(path, "read", "not a JSON object: proves nothing")
    return data


def _date(path: Path, field: str, value: object) -> dt.date:
    try:
        if isinstance(value, str) and len(value) == 10:
            return dt.date.fromisoformat(value)
    except ValueError:
        pass
    raise _fail(path, field, f"{str(value)[:40]!r} is not a date (YYYY-MM-DD)")


# ------------------------------------------------------------------------ the shipped snapshot
@functools.cache
def snapshot() -> Table:
    """The shipped snapshot: its measured entries (SPEC 2, per chip: every slice of the family
    in that region) over its catalog rows, each row's $/slice-hour divided by the slice's chips
    (the source's unit, snapshot.json `unit`)."""
    return load_snapshot(SNAPSHOT)


def load_snapshot(path: Path) -> Table:
    data = _read_json(path)
    if data.get("unit") != "usd_per_slice_hour" or data.get("columns") != [
            "accelerator_type", "region", *_COLUMNS]:
        raise _fail(path, "unit/columns", "not the snapshot layout (usd_per_slice_hour; "
                    "accelerator_type, region, ondemand, spot)")
    read_at = _date(path, "read_at", data.get("read_at")).isoformat()
    name = data.get("source")
    if not isinstance(name, str) or not re.fullmatch(r"[\w.@/-]{1,80}", name):
        raise _fail(path, "source", "missing or not a short name")
    source = f"snapshot {name} {read_at}"
    measured_source = data.get("measured_source")
    if not isinstance(measured_source, str) or not measured_source:
        raise _fail(path, "measured_source", "missing")
    table: dict[Key, Price] = {}
    for i, entry in enumerate(_list(path, data, "measured")):
        where = f"measured[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, where, "not an object")
        key = _key(path, where, entry.get("accelerator_type"), entry.get("region"),
                   entry.get("provisioning_model"))
        usd = _usd(path, where, entry.get("usd_per_chip_hour"))
        # A measured $/chip-hour prices every slice of its family in its region (a TPU SKU is
        # per chip): the measured slice says so plainly, the others that they are derived.
        family = ACCELERATORS[key[0]].family
        for accel, a in ACCELERATORS.items():
            if a.family is family:
                table[(accel, key[1], key[2])] = Price(
                    usd, spec2_source(accel, a.chips, measured_on=key[0],
                                      source=measured_source), "")
    for i, row in enumerate(_list(path, data, "rows")):
        where = f"rows[{i}]"
        if not isinstance(row, list) or len(row) != 4:
            raise _fail(path, where, "not [accelerator_type, region, ondemand, spot]")
        accel, region, *slice_prices = row
        for model, per_slice in zip(_COLUMNS, slice_prices, strict=True):
            key = _key(path, where, accel, region, model)
            if per_slice is None or key in table:  # no price there; or measured stands
                continue
            chips = ACCELERATORS[key[0]].chips
            usd = _usd(path, where, per_slice / chips if _number(per_slice) else per_slice)
            table[key] = Price(round(usd, 6), source, read_at)
    return table


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _list(path: Path, data: Mapping[str, Any], field: str) -> list[Any]:
    value = data.get(field)
    if not isinstance(value, list):
        raise _fail(path, field, "missing or not a list")
    return value


# ------------------------------------------------------------------- the refreshed Catalog file
def default_catalog_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where `tpuserve prices refresh` writes and synth reads unless [pricing] catalog_file:
    ~/.cache/tpuserve/prices.json ($XDG_CACHE_HOME/tpuserve/prices.json where that is set:
    the XDG base directory rule, which also lets tests keep a developer's file out)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the spec ignores a relative one
        return Path(xdg) / "tpuserve" / "prices.json"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".cache" / "tpuserve" / "prices.json"


def catalog_read_at(path: Path) -> dt.datetime:
    """When the file's prices were read from the Catalog (UTC)."""
    return _load_catalog(path, *_stamp(path))[0]


def load_catalog(path: Path) -> Table:
    """The prices of a refreshed file, each `catalog <date>` with its SKU (read again only
    when the file changes)."""
    return _load_catalog(path, *_stamp(path))[1]


def _read_at(path: Path, value: object) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise _fail(path, "read_at", f"{str(value)[:40]!r} is not a UTC time "
                    "(YYYY-MM-DDTHH:MM:SSZ)")
    return when.astimezone(dt.UTC)


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise _fail(path, "read", f"cannot be read ({exc.strerror or exc})") from None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _load_catalog(path: Path, _mtime: int, _size: int) -> tuple[dt.datetime, Table]:
    data = _read_json(path)
    if data.get("format") != FILE_FORMAT:
        raise _fail(path, "format", f"{str(data.get('format'))[:40]!r} is not {FILE_FORMAT!r} "
                    "(write it with `tpuserve prices refresh`)")
    when = _read_at(path, data.get("read_at"))
    read_at = when.date().isoformat()
    source = f"catalog {read_at}"
    table: dict[Key, Price] = {}
    entries = _list(path, data, "prices")
    if not entries:
        raise _fail(path, "prices", "empty: proves nothing")
    for i, entry in enumerate(entries):
        where = f"prices[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, where, "not an object")
        key = _key(path, where, entry.get("accelerator_type"), entry.get("region"),
                   entry.get("provisioning_model"))
        sku = entry.get("sku")
        if not isinstance(sku, str) or not _SKU.fullmatch(sku):
            raise _fail(path, where, f"sku = {str(sku)[:40]!r}: not a Cloud Billing SKU id")
        if key in table:
            raise _fail(path, where, f"a second price for {' '.join(key)}")
        table[key] = Price(_usd(path, where, entry.get("usd_per_chip_hour")), source,
                           read_at, sku)
    return when, table


def write_catalog(path: Path, prices: Iterable[tuple[Key, float, str]], *, read_at: dt.datetime,
                  services: Iterable[str], skipped: int) -> int:
    """Write a refreshed file atomically (a temporary file beside it, then rename): a reader
    sees the old file or the new one, never half of one. Returns the entries written."""
    entries = [{"accelerator_type": a, "region": r, "provisioning_model": m,
                "usd_per_chip_hour": usd, "sku": sku}
               for (a, r, m), usd, sku in sorted(prices)]
    body = {"format": FILE_FORMAT,
            "read_at": read_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": "Cloud Billing Catalog API v1 services.skus.list",
            "services": list(services), "skipped_skus": skipped, "prices": entries}
    import tempfile  # only a refresh writes: not on every read of a price (start-up time)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".prices.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(body, out, indent=1)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(entries)
