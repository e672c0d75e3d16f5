"""The fake Compute API's regions.get answers as compute.v1 does: a Region with its quotas,
quotaStatusWarning instead when asked, and Compute's errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import googleapiclient
import pytest
import requests

from tests.fakes.compute import FakeCompute

TOKEN = "ya29.fake-token"
DOC = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                  / "compute.v1.json").read_text())


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    fake = FakeCompute(project="proj-test-1", access_token=TOKEN).start()
    yield fake
    fake.stop()


def _get(fake: FakeCompute, path: str, token: str | None = TOKEN, **params: str,
         ) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{fake.endpoint}{path}", headers=headers, params=params, timeout=5)


def test_regions_get_as_documented(compute) -> None:
    method = DOC["resources"]["regions"]["methods"]["get"]
    assert (DOC["servicePath"], method["path"]) == ("compute/v1/",
                                                    "projects/{project}/regions/{region}")
    compute.set_quota("us-west4", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5", 8, 2)
    region = _get(compute, "projects/proj-test-1/regions/us-west4", alt="json").json()
    assert set(region) <= set(DOC["schemas"]["Region"]["properties"])
    assert region["quotas"] == [{"metric": "PREEMPTIBLE_TPU_LITE_PODSLICE_V5", "limit": 8,
                                 "usage": 2}]
    enum = DOC["schemas"]["Quota"]["properties"]["metric"]["enum"]
    assert all(q["metric"] in enum for q in region["quotas"])
    compute.quota_warning = "QUOTA_INFO_UNAVAILABLE"
    region = _get(compute, "projects/proj-test-1/regions/us-west4").json()
    assert "quotas" not in region
    warning_codes = DOC["schemas"]["Region"]["properties"]["quotaStatusWarning"]["properties"][
        "code"]["enum"]
    assert region["quotaStatusWarning"]["code"] in warning_codes


def test_regions_get_errors_as_compute_answers_them(compute) -> None:
    def err(resp: requests.Response) -> dict:
        body = resp.json()["error"]
        assert body["code"] == resp.status_code and body["errors"][0]["reason"]
        return body

    assert err(_get(compute, "projects/proj-test-1/regions/us-west4", token=None))[
        "status"] == "UNAUTHENTICATED"
    assert err(_get(compute, "projects/other/regions/us-west4"))["code"] == 403
    assert err(_get(compute, "projects/proj-test-1/regions/mars-north1"))["code"] == 404
    # Refused by the discovery document's check before the fake (Google's front-end form).
    bad = _get(compute, "projects/proj-test-1/regions/us-west4", bogus="1")
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert _get(compute, "projects/proj-test-1/regions").status_code == 404
    compute.disabled = True
    body = err(_get(compute, "projects/proj-test-1/regions/us-west4"))
    [info] = body["details"]
    assert (info["reason"], info["metadata"]["service"]) == ("SERVICE_DISABLED",
                                                             "compute.googleapis.com")
