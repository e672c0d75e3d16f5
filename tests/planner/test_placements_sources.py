"""planner/placements.py against the real price interface: a [pricing] catalog_file prices the
placements as it prices the deployment, and every region a source prices a slice in is either
placed (a zone offers it) or listed in `no_zone`, never dropped silently."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tpuserve.accelerators import ACCELERATORS
from tpuserve.planner.placement_report import print_placements
from tpuserve.planner.placements import VM_KINDS, build_placements
from tpuserve.prices import Price, prices_by_region
from tpuserve.settings import Deployment, load

SPOT = next(k.provisioning_model for k in VM_KINDS if k.spot)


def _catalog(path: Path, usd: float) -> Path:
    """A refreshed file as `tpuserve prices refresh` writes it, read a minute ago."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "format": "tpuserve-prices/1", "read_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "Cloud Billing Catalog API v1 services.skus.list", "services": [],
        "skipped_skus": 0, "prices": [{
            "accelerator_type": "v5litepod-1", "region": "us-central1",
            "provisioning_model": SPOT, "usd_per_chip_hour": usd, "sku": "AAAA-BBBB-CCCC"}]}))
    return path


def _deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str = "") -> Deployment:
    for var in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE", "TPUSERVE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no developer's file
    if toml:
        (tmp_path / "user.toml").write_text(toml)
        monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    return load().deployments["spot"]


def _row(d: Deployment, zone: str = "us-central1-a"):
    result = build_placements(d)
    return next(p for p in result.placements if (p.accelerator_type, p.zone,
                p.provisioning_model) == ("v5litepod-1", zone, SPOT))


def test_the_catalog_file_setting_prices_the_placements(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _catalog(tmp_path / "mine" / "prices.json", 0.21)
    d = _deployment(tmp_path, monkeypatch, f'[pricing]\ncatalog_file = "{path}"\n')
    assert d.pricing.catalog_path == path
    row = _row(d)
    assert row.usd_per_hour == 0.21 and row.price_source.startswith("catalog ")
    assert "SKU AAAA-BBBB-CCCC" in row.sources["usd_per_hour"]
    # The deployment's own book reads the same file: the two never disagree.
    assert d.book_price(SPOT) == Price(0.5779, "SPEC 2", "")  # its region is us-west4
    # Without the setting (and no file at the default path) the snapshot prices it.
    monkeypatch.delenv("TPUSERVE_CONFIG")
    assert _row(load().deployments["spot"]).price_source.startswith("snapshot ")


def test_the_default_cache_file_prices_them_alike(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = _deployment(tmp_path, monkeypatch)
    _catalog(tmp_path / "cache" / "tpuserve" / "prices.json", 0.22)
    row = _row(d)
    assert row.usd_per_hour == 0.22 and row.price_source.startswith("catalog ")


def test_every_region_the_snapshot_prices_is_placed_or_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _deployment(tmp_path, monkeypatch)
    result = build_placements(d)
    assert not result.skipped  # E2B fits every slice: each one's regions are checked below
    for a in ACCELERATORS:
        for kind in VM_KINDS:
            m = kind.provisioning_model
            placed = {p.region for p in result.placements
                      if (p.accelerator_type, p.provisioning_model) == (a, m)}
            listed = {n.region for n in result.no_zone
                      if (n.accelerator_type, n.provisioning_model) == (a, m)}
            assert set(prices_by_region(a, m)) <= placed | listed, (a, m)
    # v5e: the snapshot's 16 regions, each with its zones (SkyPilot's catalog's).
    v5e = {p.region for p in result.placements if p.accelerator_type == "v5litepod-1"
           and p.provisioning_model == SPOT}
    assert len(v5e) == 16 and {"asia-east1", "europe-west4", "us-east5"} <= v5e
    zones = {p.zone for p in result.placements if p.accelerator_type == "v5litepod-1"
             and p.region == "asia-east1" and p.provisioning_model == SPOT}
    assert zones == {"asia-east1-a", "asia-east1-b", "asia-east1-c"}


def test_a_priced_region_no_source_names_a_zone_in_is_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    d = _deployment(tmp_path, monkeypatch)

    def price(accelerator_type: str, region: str, model: str) -> Price | None:
        if accelerator_type == "v5litepod-1" and region in ("me-west1", "us-west4"):
            return Price(0.5, "SPEC 2", "")
        return None

    result = build_placements(d, price=price, regions=lambda a, m: ("me-west1", "us-west4"))
    [gap] = [n for n in result.no_zone if n.provisioning_model == SPOT]
    assert (gap.accelerator_type, gap.region) == ("v5litepod-1", "me-west1")
    assert "no source names a zone there" in gap.why
    assert "me-west1" not in {p.region for p in result.placements}
    assert any(n["region"] == "me-west1" for n in result.as_json()["no_zone"])
    from rich.console import Console

    print_placements(result, Console(width=200))
    assert "no zone v5litepod-1 spot me-west1: SPEC 2 prices" in capsys.readouterr().out
