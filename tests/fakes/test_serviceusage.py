"""The fake Service Usage API answers services.batchGet and services.get as serviceusage.v1
does: names with the project number, ENABLED/DISABLED, its documented limits and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import googleapiclient
import pytest
import requests

from tests.fakes.serviceusage import FakeServiceUsage

TOKEN = "ya29.fake-token"
DOC = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                  / "serviceusage.v1.json").read_text())
P = "projects/proj-test-1"


@pytest.fixture
def usage() -> Iterator[FakeServiceUsage]:
    fake = FakeServiceUsage(project="proj-test-1", number="123456789012",
                            access_token=TOKEN).start()
    yield fake
    fake.stop()


def _get(fake: FakeServiceUsage, path: str, token: str | None = TOKEN, **params: object,
         ) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{fake.endpoint}{path}", headers=headers, params=params, timeout=5)


def test_batch_get_and_get_as_documented(usage) -> None:
    methods = DOC["resources"]["services"]["methods"]
    assert methods["batchGet"]["path"] == "v1/{+parent}/services:batchGet"
    assert methods["get"]["path"] == "v1/{+name}"
    usage.enable("container.googleapis.com")
    names = [f"{P}/services/container.googleapis.com", f"{P}/services/compute.googleapis.com"]
    body = _get(usage, f"v1/{P}/services:batchGet", names=names).json()
    assert set(body) <= set(DOC["schemas"]["BatchGetServicesResponse"]["properties"])
    service = DOC["schemas"]["GoogleApiServiceusageV1Service"]
    for svc in body["services"]:
        assert set(svc) <= set(service["properties"])
        assert svc["state"] in service["properties"]["state"]["enum"]
    assert [(s["name"], s["state"]) for s in body["services"]] == [
        ("projects/123456789012/services/container.googleapis.com", "ENABLED"),
        ("projects/123456789012/services/compute.googleapis.com", "DISABLED")]
    one = _get(usage, f"v1/{P}/services/container.googleapis.com").json()
    assert one["state"] == "ENABLED"


def test_the_documented_limits_and_errors(usage) -> None:
    def status(resp: requests.Response) -> tuple[int, str]:
        err = resp.json()["error"]
        assert err["code"] == resp.status_code
        return err["code"], err["status"]

    many = [f"{P}/services/container.googleapis.com"] * 31  # "a maximum of 30"
    assert status(_get(usage, f"v1/{P}/services:batchGet", names=many)) == (
        400, "INVALID_ARGUMENT")
    assert status(_get(usage, f"v1/{P}/services:batchGet")) == (400, "INVALID_ARGUMENT")
    outside = ["projects/other/services/container.googleapis.com"]
    assert status(_get(usage, f"v1/{P}/services:batchGet", names=outside))[0] == 400
    assert status(_get(usage, f"v1/{P}/services:batchGet", names=[f"{P}/services/x.y"]))[0] == 403
    assert status(_get(usage, f"v1/{P}/services:batchGet", token=None, names=many[:1]))[0] == 401
    assert status(_get(usage, "v1/projects/other/services/container.googleapis.com"))[0] == 403
    assert status(_get(usage, f"v1/{P}/services/container.googleapis.com", foo="1"))[0] == 400
