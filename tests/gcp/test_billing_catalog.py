"""`tpuserve prices refresh` against a fake Cloud Billing Catalog API (cloudbilling.v1): the
dated file it writes, pagination, skipped SKUs, and every refusal in one line."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fakes.cloudbilling import COMPUTE, TPU, FakeCloudBilling, tpu_sku
from tpuserve.gcp.api import UnprovenAnswer
from tpuserve.gcp.billing_catalog import catalog_api, refresh
from tpuserve.gcp.errors import ApiError
from tpuserve.prices import price_of
from tpuserve.prices.skus import SkuRefused

TOKEN = "ya29.fake-billing-token"
NOW = dt.datetime(2026, 12, 2, 4, 0, tzinfo=dt.UTC)
V5E_OD = tpu_sku("AB12-CD34-EF56", "TpuV5e Chip-hour running in Americas",
                 ["us-central1", "us-west4"], 1.2)
V5E_SPOT = tpu_sku("AB12-CD34-EF57", "Preemptible TpuV5e Chip-hour running in Americas",
                   ["us-central1"], 0.24)
V6E_SPOT = tpu_sku("BC12-CD34-EF58", "TpuV6e Spot chip-hour in Columbus", ["us-east5"], 1.35)
N1 = {**tpu_sku("CD12-CD34-EF59", "N1 Predefined Instance Core running in Americas",
                ["us-central1"], 0.031611)}


@pytest.fixture
def fake() -> Iterator[FakeCloudBilling]:
    with FakeCloudBilling(access_token=TOKEN) as server:
        server.services[COMPUTE] = [V5E_OD, N1, V5E_SPOT, V6E_SPOT]
        yield server


def _refresh(fake: FakeCloudBilling, path: Path, deadline_s: float = 30.0):
    return refresh(catalog_api(fake.environ()), path, deadline_s=deadline_s, now=lambda: NOW)


def test_refresh_writes_per_chip_prices_with_their_sku_and_date(fake, tmp_path) -> None:
    path = tmp_path / "prices.json"
    done = _refresh(fake, path)
    # v5e on demand in two regions and spot in one, v6e spot in one: every slice of each family.
    assert (done.prices, done.skus, done.unmatched) == (3 * 3 + 3, 4, 1)
    spot = price_of("v5litepod-4", "us-central1", "spot", catalog_file=path, now=NOW)
    assert spot is not None and (spot.usd_per_chip_hour, spot.source, spot.read_at,
                                 spot.sku) == (0.24, "catalog 2026-12-02", "2026-12-02",
                                               "AB12-CD34-EF57")
    assert price_of("v6e-8", "us-east5", "spot", catalog_file=path, now=NOW).sku == (
        "BC12-CD34-EF58")
    assert json.loads(path.read_text())["read_at"] == "2026-12-02T04:00:00Z"
    assert [c.service for c in fake.calls] == [COMPUTE, TPU]  # both documented services


def test_refresh_follows_every_page(fake, tmp_path) -> None:
    fake.services[TPU] = [tpu_sku(f"EE00-0000-{i:04d}", f"Tpu-v3 Pod {i}", ["us-central1"], 8)
                          for i in range(5)]
    done = refresh(catalog_api(fake.environ()), tmp_path / "p.json", deadline_s=30,
                   now=lambda: NOW)
    assert done.unmatched == 1 + 5
    from tpuserve.gcp import billing_catalog
    got = list(billing_catalog.skus(catalog_api(fake.environ()), f"services/{TPU}",
                                    page_size=2))
    assert len(got) == 5
    assert [(c.page_size, c.page_token) for c in fake.calls[-3:]] == [
        ("2", None), ("2", "tok1"), ("2", "tok2")]


def test_a_sku_of_another_product_is_skipped_and_counted(fake, tmp_path) -> None:
    fake.services[COMPUTE] = [V5E_OD, N1, N1, tpu_sku("AA00-0000-0001", "TpuV5p chip-hour",
                                                      ["us-east5"], 4.2)]
    done = _refresh(fake, tmp_path / "p.json")
    assert (done.unmatched, done.prices) == (3, 6)  # N1 twice and v5p: no accelerator here


def test_a_commitment_sku_is_skipped_and_counted(fake, tmp_path) -> None:
    fake.services[COMPUTE] = [V5E_OD, tpu_sku("AA00-0000-0002", "Commitment v1: TpuV5e in "
                                              "Americas for 1 Year", ["us-west4"], 0.84,
                                              usage="Commit1Yr")]
    assert _refresh(fake, tmp_path / "p.json").commitments == 1


def test_permission_denied_is_one_line_and_writes_nothing(fake, tmp_path) -> None:
    fake.denied = True
    with pytest.raises(ApiError) as err:
        _refresh(fake, tmp_path / "p.json")
    assert err.value.code == 403 and err.value.reason == "IAM_PERMISSION_DENIED"
    assert "\n" not in str(err.value) and not (tmp_path / "p.json").exists()


def test_service_disabled_names_the_api(fake, tmp_path) -> None:
    fake.disabled = True
    with pytest.raises(ApiError) as err:
        _refresh(fake, tmp_path / "p.json")
    assert err.value.reason == "SERVICE_DISABLED"
    assert err.value.details.metadata["service"] == "cloudbilling.googleapis.com"
    assert "\n" not in str(err.value)


def test_rate_limited_past_the_deadline_is_one_line(fake, tmp_path) -> None:
    retry = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0s"}]
    fake.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", details=retry, times=100)
    with pytest.raises(ApiError) as err:
        _refresh(fake, tmp_path / "p.json")
    assert err.value.code == 429 and "\n" not in str(err.value)
    assert len(fake.calls) > 1  # retried, as a rate limit is, within the policy


def test_a_rate_limit_that_clears_is_retried(fake, tmp_path) -> None:
    fake.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", details=[
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0s"}])
    assert _refresh(fake, tmp_path / "p.json").prices == 12


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda s: s["pricingInfo"][0]["pricingExpression"].update(usageUnit="mo"), "usageUnit"),
    (lambda s: s.update(serviceRegions=[]), "serviceRegions"),
    (lambda s: s["category"].pop("usageType"), "usageType"),
    (lambda s: s["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"].update(
        units="0", nanos=0), "unitPrice"),
])
def test_a_malformed_tpu_sku_is_refused_naming_it_and_the_field(fake, tmp_path, mutate,
                                                                 field) -> None:
    bad = json.loads(json.dumps(V6E_SPOT))
    mutate(bad)
    fake.services[COMPUTE] = [V5E_OD, bad]
    path = tmp_path / "p.json"
    path.write_text("old")
    with pytest.raises(SkuRefused) as err:
        _refresh(fake, path)
    assert str(err.value).startswith("SKU BC12-CD34-EF58 'TpuV6e Spot") and field in str(
        err.value) and "\n" not in str(err.value)
    assert path.read_text() == "old"  # nothing written over the old file


def test_two_skus_disagreeing_on_one_price_are_refused(fake, tmp_path) -> None:
    other = tpu_sku("AB12-CD34-FFFF", "TpuV5e Chip-hour", ["us-west4"], 1.3)
    fake.services[COMPUTE] = [V5E_OD, other]
    with pytest.raises(SkuRefused, match=r"SKU AB12-CD34-EF56 at 1\.2"):
        _refresh(fake, tmp_path / "p.json")


def test_an_empty_answer_proves_nothing(fake, tmp_path) -> None:
    fake.services[COMPUTE] = []  # {"skus": [], ...}: no TPU price at all
    with pytest.raises(SkuRefused, match="proves nothing"):
        _refresh(fake, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_an_answer_that_is_not_a_list_proves_nothing(fake, tmp_path) -> None:
    fake.answer_next({"kind": "something else"})
    with pytest.raises(UnprovenAnswer, match="none of the list's fields"):
        _refresh(fake, tmp_path / "p.json")


def test_a_repeated_page_token_is_cut(fake, tmp_path) -> None:
    fake.answer_next({"skus": [V5E_OD], "nextPageToken": "same"}, times=2)
    with pytest.raises(UnprovenAnswer, match="repeats an earlier page"):
        _refresh(fake, tmp_path / "p.json")


def test_the_fake_takes_only_documented_parameters(fake) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{fake.endpoint}v1/services/{COMPUTE}/skus"
    assert requests.get(url, params={"pageSize": "2"}, headers=headers, timeout=5).ok
    refused = requests.get(url, params={"page_size": "2"}, headers=headers, timeout=5)
    assert refused.status_code == 400 and refused.json()["error"]["status"] == (
        "INVALID_ARGUMENT")
    assert requests.get(url, params={"pageSize": "two"}, headers=headers,
                        timeout=5).status_code == 400
    assert requests.get(url, headers={}, timeout=5).status_code == 401


def test_the_fakes_answers_are_held_to_the_document(fake) -> None:
    from tests.fakes.discovery import Discovery

    doc = Discovery.load("cloudbilling", "v1")
    before = len(doc.violations)
    fake.services[COMPUTE] = [{**V5E_OD, "colour": "red"}]  # a field Sku does not have
    answer = requests.get(f"{fake.endpoint}v1/services/{COMPUTE}/skus",
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert answer.status_code == 500 and "refused by the discovery document" in answer.text
    del doc.violations[before:]  # provoked here on purpose: the suite's check stays clean


def test_a_catalog_that_does_not_answer_is_cut_by_the_deadline(fake, tmp_path) -> None:
    import threading

    from werkzeug import Response

    release = threading.Event()

    def stall() -> Response:
        release.wait(10)  # answers only once the test is done
        return Response("{}", 200, mimetype="application/json")

    fake.faults.add(lambda r: True, stall, times=10)
    try:
        with pytest.raises(ApiError) as err:
            _refresh(fake, tmp_path / "p.json", deadline_s=1.0)
    finally:
        release.set()
    assert err.value.status == "DEADLINE_EXCEEDED" and "--timeout" in str(err.value)
    assert not (tmp_path / "p.json").exists()


def _detail(error: dict, kind: str) -> dict:
    kind = f"type.googleapis.com/google.rpc.{kind}"
    return next(d for d in error["details"] if d["@type"] == kind)


def test_every_error_of_the_fake_is_a_status_with_details(fake) -> None:
    # AIP-193: every error carries an ErrorInfo (reason, domain); a 400 a BadRequest naming
    # the field; a 404 for a service a ResourceInfo naming it.
    url = f"{fake.endpoint}v1/services/{COMPUTE}/skus"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    missing = requests.get(url, timeout=5).json()["error"]
    assert missing["code"] == 401 and missing["status"] == "UNAUTHENTICATED"
    assert _detail(missing, "ErrorInfo")["reason"] == "CREDENTIALS_MISSING"
    wrong = requests.get(url, headers={"Authorization": "Bearer other"}, timeout=5).json()
    info = _detail(wrong["error"], "ErrorInfo")
    assert (info["reason"], info["domain"]) == ("ACCESS_TOKEN_TYPE_UNSUPPORTED", "googleapis.com")
    assert info["metadata"]["service"] == "cloudbilling.googleapis.com"
    token = requests.get(url, params={"pageToken": "forged"}, headers=bearer, timeout=5)
    assert token.status_code == 400
    violation = _detail(token.json()["error"], "BadRequest")["fieldViolations"][0]
    assert violation["field"] == "page_token"
    assert _detail(token.json()["error"], "ErrorInfo")["reason"] == "INVALID_ARGUMENT"
    size = requests.get(url, params={"pageSize": "-1"}, headers=bearer, timeout=5).json()
    assert _detail(size["error"], "BadRequest")["fieldViolations"][0]["field"] == "page_size"
    gone = requests.get(f"{fake.endpoint}v1/services/0000-0000-0000/skus", headers=bearer,
                        timeout=5)
    assert gone.status_code == 404
    assert _detail(gone.json()["error"], "ResourceInfo")["resourceName"] == (
        "services/0000-0000-0000")
    assert _detail(gone.json()["error"], "ErrorInfo")["reason"] == "RESOURCE_NOT_FOUND"


def test_a_refused_token_is_one_line_with_its_reason(fake, tmp_path) -> None:
    env = {**fake.environ(), "CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.another"}  # not the fake's
    with pytest.raises(ApiError) as err:
        refresh(catalog_api(env), tmp_path / "p.json", deadline_s=30.0, now=lambda: NOW)
    assert err.value.code == 401 and err.value.reason == "ACCESS_TOKEN_TYPE_UNSUPPORTED"
    assert "\n" not in str(err.value) and not (tmp_path / "p.json").exists()


def test_a_service_the_catalog_does_not_know_is_one_line(fake, tmp_path) -> None:
    del fake.services[TPU]
    with pytest.raises(ApiError) as err:
        _refresh(fake, tmp_path / "p.json")
    assert err.value.code == 404 and err.value.reason == "RESOURCE_NOT_FOUND"
    assert "\n" not in str(err.value) and not (tmp_path / "p.json").exists()
