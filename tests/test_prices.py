"""tpuserve.prices: the shipped snapshot, the refreshed file and their precedence, each price
with its source; and the deployment pricing its own accelerator in its own region."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tpuserve.accelerators import ACCELERATORS
from tpuserve.prices import (
    CATALOG_MAX_AGE_DAYS,
    Price,
    PriceFileError,
    default_catalog_file,
    price_of,
    prices_by_region,
)
from tpuserve.prices.table import SNAPSHOT, load_snapshot, write_catalog
from tpuserve.settings import load
from tpuserve.settings.base import ConfigError

NOW = dt.datetime(2026, 12, 2, 4, 0, tzinfo=dt.UTC)
SNAP = "snapshot skypilot-catalog@8427bbf 2026-12-02"


def _catalog(path: Path, *entries: tuple[str, str, str, float], age_days: float = 1) -> Path:
    write_catalog(path, [((a, r, m), usd, "AB12-CD34-EF56") for a, r, m, usd in entries],
                  read_at=NOW - dt.timedelta(days=age_days), services=["services/x"], skipped=0)
    return path


def test_the_default_deployments_prices_stay_spec2s() -> None:
    # v5litepod-1 in us-west4: the snapshot keeps SPEC 2's measured figures.
    for model, usd in (("spot", 0.5779), ("flex", 0.6), ("ondemand", 1.2)):
        assert price_of("v5litepod-1", "us-west4", model) == Price(usd, "SPEC 2", "")


def test_the_snapshot_is_per_chip_and_sourced() -> None:
    # The source's figures are per slice-hour: v5litepod-8 spot in us-central1 is 1.95941/8.
    p = price_of("v5litepod-8", "us-central1", "spot")
    assert p == Price(round(1.95941 / 8, 6), SNAP, "2026-12-02")
    assert price_of("v6e-4", "us-east5", "ondemand").usd_per_chip_hour == 2.7
    # Flex-start: no source but SPEC 2 (v5e, us-west4) names a price; the 700.0 placeholder
    # of the source is no price either.
    assert price_of("v6e-1", "us-east5", "flex") is None
    assert price_of("v6e-1", "southamerica-west1", "spot") is None
    assert price_of("v6e-1", "southamerica-west1", "ondemand").usd_per_chip_hour == 2.7


def test_the_snapshot_covers_every_accelerator_on_demand_and_spot() -> None:
    data = json.loads(SNAPSHOT.read_text())
    assert data["origin"]["commit"] == "8427bbff988abdd050a9f51addd314ef31cb4e85"
    for accel in ACCELERATORS:
        assert len(prices_by_region(accel, "ondemand")) >= 8, accel
        assert len(prices_by_region(accel, "spot")) >= 8, accel


def test_a_malformed_snapshot_is_refused(tmp_path: Path) -> None:
    data = json.loads(SNAPSHOT.read_text())
    data["rows"][0][2] = 1e6  # a price per month, say
    (bad := tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(PriceFileError, match=r"rows\[0\]: usd_per_chip_hour = 1000000"):
        load_snapshot(bad)


def test_a_refreshed_file_stands_over_the_snapshot_while_young(tmp_path: Path) -> None:
    path = _catalog(tmp_path / "p.json", ("v5litepod-1", "us-west4", "spot", 0.5),
                    age_days=CATALOG_MAX_AGE_DAYS - 1)
    p = price_of("v5litepod-1", "us-west4", "spot", catalog_file=path, now=NOW)
    assert p == Price(0.5, "catalog 2026-11-03", "2026-11-03", "AB12-CD34-EF56")
    # What the file does not price falls through to the snapshot, then SPEC 2.
    assert price_of("v5litepod-1", "us-west4", "flex", catalog_file=path, now=NOW).source == (
        "SPEC 2")
    old = _catalog(tmp_path / "old.json", ("v5litepod-1", "us-west4", "spot", 0.5),
                   age_days=CATALOG_MAX_AGE_DAYS)
    assert price_of("v5litepod-1", "us-west4", "spot", catalog_file=old, now=NOW).source == (
        "SPEC 2")


@pytest.mark.parametrize(("text", "why"), [
    ("{", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"format": "tpuserve-prices/1", "read_at": "2026-12-01T00:00:00Z", "prices": []}',
     "empty: proves nothing"),
    ('{"format": "tpuserve-prices/1", "read_at": "yesterday", "prices": []}', "not a UTC time"),
    (('{"format": "tpuserve-prices/1", "read_at": "2026-12-01T00:00:00Z", "prices": '
      '[{"accelerator_type": "v5litepod-1", "region": "us-west4", "provisioning_model": "spot",'
      ' "usd_per_chip_hour": 0.5, "sku": "x"}]}'), "not a Cloud Billing SKU id"),
])
def test_a_malformed_refreshed_file_is_refused(tmp_path: Path, text: str, why: str) -> None:
    (path := tmp_path / "p.json").write_text(text)
    with pytest.raises(PriceFileError, match=why):
        price_of("v5litepod-1", "us-west4", "spot", catalog_file=path, now=NOW)


def test_the_default_file_is_the_cache_and_honours_xdg() -> None:
    assert default_catalog_file({"HOME": "/h"}) == Path("/h/.cache/tpuserve/prices.json")
    assert default_catalog_file({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path(
        "/x/tpuserve/prices.json")
    assert default_catalog_file({"HOME": "/h", "XDG_CACHE_HOME": "rel"}) == Path(
        "/h/.cache/tpuserve/prices.json")  # a relative XDG_CACHE_HOME is ignored (the spec)


def _user(tmp_path: Path, text: str) -> dict[str, str]:
    (cfg := tmp_path / "user.toml").write_text(text)
    return {"TPUSERVE_CONFIG": str(cfg)}


def test_the_deployment_prices_its_accelerator_in_its_region(tmp_path: Path) -> None:
    env = _user(tmp_path, '[gcp]\nzone = "us-central1-a"\n[tpu]\naccelerator_type = '
                          '"v5litepod-4"\n[stacks.flex]\nenabled = false\n')
    d = load(env).deployments["spot"]
    assert d.price == Price(round(0.9797 / 4, 6), SNAP, "2026-12-02")
    assert d.usd_per_hour == pytest.approx(0.9797)
    assert load(env).deployments["ondemand"].usd_per_hour == pytest.approx(4.8)


def test_a_pricing_key_the_user_sets_stands_over_every_file(tmp_path: Path) -> None:
    path = _catalog(tmp_path / "p.json", ("v5litepod-1", "us-west4", "spot", 0.5),
                    age_days=0)
    env = _user(tmp_path, '[pricing]\nspot = 0.7\ncatalog_file = "p.json"\n')
    loaded = load(env).deployments
    assert loaded["spot"].price == Price(0.7, "pricing setting", "")
    assert loaded["spot"].pricing.catalog_path == path.resolve()  # beside the file naming it
    env = _user(tmp_path, '[pricing]\ncatalog_file = "p.json"\n')
    assert load(env).deployments["spot"].price.source.startswith("catalog ")


def test_the_default_cache_file_is_read_and_a_broken_one_refused(tmp_path: Path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = default_catalog_file()
    cache.parent.mkdir(parents=True)
    _catalog(cache, ("v5litepod-1", "us-west4", "ondemand", 1.1), age_days=0)
    assert load({}).deployments["ondemand"].usd_per_hour == 1.1
    cache.write_text("{")
    with pytest.raises(ConfigError) as err:
        load({})
    assert err.value.problems[0].startswith("[spot, ondemand, flex, fleet] pricing.catalog_file"
                                            f" = '{cache}' (unset: the default path): read: ")


def test_a_named_catalog_file_that_is_missing_is_refused(tmp_path: Path) -> None:
    env = _user(tmp_path, '[pricing]\ncatalog_file = "missing.json"\n')
    with pytest.raises(ConfigError, match=r"pricing\.catalog_file = .*missing\.json.*cannot be"):
        load(env)


def test_synth_names_a_cheaper_region_with_both_sources() -> None:
    (line,) = [w for w in load({}).warnings if w.startswith("[spot] pricing.spot:")]
    assert line.startswith("[spot] pricing.spot: v5litepod-1 spot costs $0.2449/chip-hour in "
                           f"us-central1 ({SNAP}) against $0.5779 here in us-west4 (SPEC 2)")
    assert "gcp.deployment" in line and "us-central1-a" in line
    # On demand costs the same in us-central1: nothing cheaper, nothing said.
    assert not [w for w in load({}).warnings if w.startswith("[ondemand] pricing.")]


def test_no_cheaper_region_where_the_zone_is_the_cheapest(tmp_path: Path) -> None:
    env = _user(tmp_path, '[gcp]\nzone = "us-central1-a"\n[stacks.flex]\nenabled = false\n')
    assert not [w for w in load(env).warnings if w.startswith("[spot] pricing.spot:")]


def test_a_refreshed_file_from_the_future_is_refused(tmp_path: Path) -> None:
    path = _catalog(tmp_path / "p.json", ("v5litepod-1", "us-west4", "spot", 0.5), age_days=-3)
    with pytest.raises(PriceFileError, match="in the future"):
        price_of("v5litepod-1", "us-west4", "spot", catalog_file=path, now=NOW)


def test_a_stale_file_is_named_at_synth(tmp_path: Path) -> None:
    _catalog(tmp_path / "p.json", ("v5litepod-1", "us-west4", "spot", 0.5), age_days=45)
    env = _user(tmp_path, '[pricing]\ncatalog_file = "p.json"\n')
    stale = [w for w in load(env).warnings if "days ago (over 30): not used" in w]
    assert len(stale) == 4 and stale[0].startswith("[spot] pricing.catalog_file = ")
