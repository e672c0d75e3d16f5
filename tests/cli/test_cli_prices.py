"""`tpuserve prices refresh` end to end against the fake Catalog API: where it writes, what it
prints, its one-line refusals, and synth then pricing with the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import assert_one_line_error, invoke
from tests.fakes.cloudbilling import COMPUTE, FakeCloudBilling, tpu_sku
from tpuserve.settings import load

TOKEN = "ya29.fake-billing-token"
SPOT = tpu_sku("AB12-CD34-EF57", "Preemptible TpuV5e Chip-hour", ["us-west4"], 0.5)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeCloudBilling]:
    with FakeCloudBilling(access_token=TOKEN) as server:
        server.services[COMPUTE] = [SPOT]
        for name, value in server.environ().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.delenv("TPUSERVE_CONFIG", raising=False)
        yield server


def test_refresh_writes_the_cache_file_synth_then_reads(fake, tmp_path) -> None:
    result = invoke("prices", "refresh", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    cache = tmp_path / "cache" / "tpuserve" / "prices.json"
    assert (out["catalog_file"], out["prices"], out["skus"]) == (str(cache), 3, 1)
    spot = load({}).deployments["spot"]
    assert (spot.usd_per_hour, spot.price.sku) == (0.5, "AB12-CD34-EF57")
    assert spot.price.source.startswith("catalog ")


def test_refresh_writes_the_configs_catalog_file(fake, tmp_path, monkeypatch) -> None:
    (cfg := tmp_path / "user.toml").write_text('[pricing]\ncatalog_file = "mine.json"\n')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(cfg))
    assert invoke("prices", "refresh").exit_code == 0
    assert json.loads((tmp_path / "mine.json").read_text())["prices"][0]["sku"] == (
        "AB12-CD34-EF57")


def test_a_refused_sku_is_one_line_and_exit_1(fake) -> None:
    bad = json.loads(json.dumps(SPOT))
    bad["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "GiBy.mo"
    fake.services[COMPUTE] = [bad]
    result = invoke("prices", "refresh")
    assert result.exit_code == 1
    assert_one_line_error(result, "SKU AB12-CD34-EF57", "usageUnit")


def test_permission_denied_is_one_line(fake) -> None:
    fake.denied = True
    result = invoke("prices", "refresh", "--json")
    assert_one_line_error(result, "403")
    assert json.loads(result.stdout)["ok"] is False


def test_refresh_mends_a_broken_cache_file_that_stops_synth(fake, tmp_path) -> None:
    cache = tmp_path / "cache" / "tpuserve" / "prices.json"
    cache.parent.mkdir(parents=True)
    cache.write_text("{")  # every deployment is refused while it is there
    assert invoke("plan").exit_code == 2
    assert invoke("prices", "refresh").exit_code == 0  # reads no deployment to find its path
    assert load({}).deployments["spot"].usd_per_hour == 0.5
