"""The fake TPU API's own fidelity: it accepts exactly the documented request shapes and
answers like the API does (tests/fakes/tpu_api.py), so tests against it mean something."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.fakes.tpu_api import FakeTpuApi
from tests.gcp.tpu_support import PROJECT, QR_ID, REF, ZONE, body


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as server:
        yield server


def _get(api: FakeTpuApi, path: str) -> requests.Response:
    return requests.get(f"{api.url}{path}", headers={"Authorization": f"Bearer {api.token}"},
                        timeout=5)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b.update(provisioning_model="FLEX_START"), 'Unknown name "provisioning_model"'),
    (lambda b: b["tpu"]["nodeSpec"][0]["node"].update(accelerator_type="v5litepod-1"),
     "Unknown name \"accelerator_type\" at 'queued_resource.tpu.node_spec[0].node'"),
    (lambda b: b.pop("provisioningModel"), "provisioningModel must be FLEX_START"),
    (lambda b: b.pop("runDuration"), "maxRunDuration is required"),
    (lambda b: b["runDuration"].update(maxRunDuration="4h"),
     "Invalid value at 'queued_resource.run_duration.max_run_duration'"),
    (lambda b: b["runDuration"].update(maxRunDuration="691200s"), "at most 7 days"),
    (lambda b: b["tpu"]["nodeSpec"][0]["node"]["networkConfig"].pop("enableExternalIps"),
     "enableExternalIps must be true"),
    (lambda b: b["tpu"]["nodeSpec"][0]["node"]["networkConfig"].update(
        enableExternalIps="true"), "(TYPE_BOOL)"),
    (lambda b: b["tpu"]["nodeSpec"][0].pop("nodeId"), "nodeId is required"),
    (lambda b: b["tpu"]["nodeSpec"][0]["node"].update(tags="tpuserve-flex"), "expected a list"),
])
def test_fake_rejects_every_undocumented_shape(api, mutate, message: str) -> None:
    b = body()
    mutate(b)
    resp = requests.post(
        f"{api.url}v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources",
        params={"queuedResourceId": QR_ID}, json=b,
        headers={"Authorization": f"Bearer {api.token}"}, timeout=5,
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and message in error["message"]
    assert not api.queued_resources

def test_fake_requires_a_bearer_token_and_known_query_parameters(api) -> None:
    url = f"{api.url}v2alpha1/{REF.name}"
    assert requests.get(url, timeout=5).json()["error"]["status"] == "UNAUTHENTICATED"
    auth = {"Authorization": f"Bearer {api.token}"}
    assert requests.get(url, headers=auth, timeout=5).status_code == 404
    bad = requests.delete(url, params={"forced": "true"}, headers=auth, timeout=5)
    assert "Cannot bind query parameter" in bad.json()["error"]["message"]
    assert [r.authorized for r in api.requests] == [False, True, True]


def test_a_create_answers_with_a_running_operation_that_ends_accepted(api) -> None:
    resp = requests.post(
        f"{api.url}v2alpha1/{REF.parent}/queuedResources", params={"queuedResourceId": QR_ID},
        json=body(), headers={"Authorization": f"Bearer {api.token}"}, timeout=5,
    ).json()
    assert resp["done"] is False
    assert resp["name"].startswith(f"{REF.parent}/operations/operation-")
    assert resp["metadata"]["verb"] == "create" and resp["metadata"]["target"] == REF.name
    api.advance()
    op = _get(api, f"v2alpha1/{resp['name']}").json()
    assert op["done"] is True
    assert op["response"]["name"] == REF.name and op["response"]["state"]["state"] == "ACCEPTED"


def test_a_queued_resources_node_answers_on_v2_and_v2alpha1(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    for version in ("v2", "v2alpha1"):
        node = _get(api, f"{version}/{REF.parent}/nodes/{QR_ID}").json()
        assert node["state"] == "READY" and node["queuedResource"] == REF.name
        ip = node["networkEndpoints"][0]["accessConfig"]["externalIp"]
        assert ip.startswith("203.0.113.")
    spot = api.seed_node(PROJECT, ZONE, "tpuserve-spot", external_ip=None)
    listed = _get(api, f"v2/{REF.parent}/nodes").json()["nodes"]
    assert [n["name"] for n in listed] == [f"{REF.parent}/nodes/{QR_ID}", spot]


def test_locations_list_answers_every_zone_paged(api) -> None:
    api.locations = ["us-west4-a", "us-west4-b", "europe-west4-a"]
    api.seed_node(PROJECT, "us-east5-a", "tpuserve-spot")  # a seeded zone is listed too
    url = f"v2/projects/{PROJECT}/locations"
    first = _get(api, f"{url}?pageSize=3").json()
    assert first["locations"][0] == {"name": f"projects/{PROJECT}/locations/europe-west4-a",
                                     "locationId": "europe-west4-a"}
    second = _get(api, f"{url}?pageSize=3&pageToken={first['nextPageToken']}").json()
    assert "nextPageToken" not in second
    ids = [loc["locationId"] for loc in first["locations"] + second["locations"]]
    assert ids == ["europe-west4-a", "us-east5-a", "us-west4-a", "us-west4-b"]
    assert _get(api, f"v2alpha1/projects/{PROJECT}/locations").json()["locations"]
    assert _get(api, f"{url}?filter=x").json()["error"]["status"] == "INVALID_ARGUMENT"
    assert _get(api, f"{url}?page_size=3").status_code == 400  # unknown query parameter
    assert requests.get(f"{api.url}{url}", timeout=5).status_code == 401


NODE_PATH = f"v2/{REF.parent}/nodes/{QR_ID}"


def _patch(api: FakeTpuApi, node: object, mask: str | None = "metadata",
           path: str = NODE_PATH) -> requests.Response:
    return requests.patch(f"{api.url}{path}",
                          params={"updateMask": mask} if mask is not None else None, json=node,
                          headers={"Authorization": f"Bearer {api.token}"}, timeout=5)


@pytest.mark.parametrize(("mask", "node", "message"), [
    (None, {"metadata": {"a": "b"}}, "update_mask is required"),
    ("", {"metadata": {"a": "b"}}, "update_mask is required"),
    ("metadata,colour", {"metadata": {"a": "b"}}, "'colour' is not a field of Node"),
    ("acceleratorType", {"acceleratorType": "v5litepod-4"}, "'acceleratorType' cannot be updated"),
    ("state", {"metadata": {}}, "'state' cannot be updated"),
    ("metadata", {"metadata": {"a": 1}}, "Invalid value at 'node.metadata[a]' (TYPE_STRING)"),
    ("metadata", {"metadata": ["a"]}, "'node.metadata' (object)"),
    ("metadata", {"metadata": {}, "state": "READY"}, "Field 'node.state' is output only"),
    ("metadata", {"metadata": {}, "name": "projects/x/locations/y/nodes/z"},
     "Field 'node.name' is output only"),   # only the URL's own name may be repeated
    ("metadata", {"meta_data": {}}, 'Unknown name "meta_data"'),
    ("metadata", ["metadata"], "(Node)"),
])
def test_a_node_patch_takes_only_the_documented_shape(api, mask, node, message) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    before = api.node_json(QR_ID)
    resp = _patch(api, node, mask)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and message in error["message"]
    assert api.node_json(QR_ID) == before and not api.operations


def test_a_node_patch_answers_an_operation_and_lands_when_it_is_done(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script="old"))
    new = {"startup-script": "new", "enable-oslogin": "TRUE"}
    op = _patch(api, {"name": f"{REF.parent}/nodes/{QR_ID}", "metadata": new}).json()
    assert op["done"] is False and op["metadata"]["verb"] == "update"
    assert op["metadata"]["target"] == f"{REF.parent}/nodes/{QR_ID}"
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": "old"}  # not yet
    op = _get(api, f"v2/{op['name']}").json()
    assert op["done"] is True and op["response"]["metadata"] == new
    assert api.node_json(QR_ID)["metadata"] == new
    # The whole map is replaced; the queued resource keeps the spec it was created with.
    assert api.queued_resource(QR_ID)["tpu"]["nodeSpec"][0]["node"]["metadata"] == {
        "startup-script": "old"}
    # A field in the mask but not in the body is cleared; others stay.
    api.patch_reads_until_done = 0
    assert _patch(api, {}, "metadata,labels").json()["done"] is True
    node = api.node_json(QR_ID)
    assert "metadata" not in node and "labels" not in node and node["tags"] == [QR_ID]


def test_a_node_patch_of_a_missing_node_or_a_failed_operation_changes_nothing(api) -> None:
    assert _patch(api, {"metadata": {}}).status_code == 404
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script="old"))
    api.fail_next_patch_operation(13, "fake: internal error")
    op = _patch(api, {"metadata": {"startup-script": "new"}}).json()
    assert op["done"] is True and op["error"]["message"] == "fake: internal error"
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": "old"}
    assert _patch(api, {"metadata": {}}, path=f"v2alpha1/{REF.parent}/nodes/{QR_ID}").ok


def test_an_injected_error_has_google_rpc_status_shape_with_details(api) -> None:
    details = [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
         "domain": "googleapis.com", "metadata": {"service": "tpu.googleapis.com"}},
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
         "violations": [{"subject": f"project:{PROJECT}", "description": "TPU v5 lite chips"}]},
    ]
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded", method="GET", details=details)
    resp = _get(api, f"v2alpha1/{REF.name}")
    assert resp.status_code == 429
    assert resp.json() == {"error": {"code": 429, "message": "Quota exceeded",
                                     "status": "RESOURCE_EXHAUSTED", "details": details}}
    from tpuserve.gcp.errors import ApiError

    err = ApiError.from_response(resp, action="get", service="tpu")
    assert err.reason == "RATE_LIMIT_EXCEEDED" and err.details.quota_failure
    assert not err.is_rate_limit  # a QuotaFailure makes it quota, whatever the reason says


def test_hooks_land_between_a_clients_calls(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script="old"))
    node = f"{REF.parent}/nodes/{QR_ID}"
    api.after_next(lambda: api.set_node_metadata(node, {"k": "v"}), method="GET",
                   path_contains="/nodes/")
    assert _get(api, f"v2/{node}").json()["metadata"] == {"startup-script": "old"}  # answered
    assert _get(api, f"v2/{node}").json()["metadata"] == {"k": "v"}  # then the write landed
    api.on_next_patch_applied(lambda: api.set_node_metadata(node, {"k": "theirs"}))
    api.patch_reads_until_done = 0
    assert _patch(api, {"metadata": {"k": "ours"}}).json()["done"] is True
    assert api.node_json(QR_ID)["metadata"] == {"k": "theirs"}
