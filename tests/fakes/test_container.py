"""The fake Container API's clusters.list and getServerConfig answer as the v1 REST API does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.fakes.container import PROJECT_NUMBER, FakeContainer

TOKEN = "ya29.fake-token"
PROJECT = "proj-test-1"
OURS = {"managed-by": "tpuserve", "deployment": "tpuserve", "stack": "fleet"}


@pytest.fixture
def gke() -> Iterator[FakeContainer]:
    with FakeContainer(project=PROJECT, access_token=TOKEN) as fake:
        yield fake


def _get(gke: FakeContainer, path: str, token: str | None = TOKEN,
         **params: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{gke.endpoint}{path}", headers=headers, params=params, timeout=5,
                        allow_redirects=False)


def test_clusters_list_by_location_with_labels_as_resource_labels(gke) -> None:
    gke.add_cluster("us-west4-a", "tpuserve-fleet", labels=OURS)
    gke.add_cluster("us-west4", "regional")
    gke.add_cluster("europe-west4-a", "elsewhere")
    every = _get(gke, f"v1/projects/{PROJECT}/locations/-/clusters").json()
    assert [(c["location"], c["name"]) for c in every["clusters"]] == [
        ("europe-west4-a", "elsewhere"), ("us-west4", "regional"),
        ("us-west4-a", "tpuserve-fleet")]
    fleet = every["clusters"][-1]
    assert fleet["resourceLabels"] == OURS and fleet["status"] == "RUNNING"
    assert fleet["selfLink"].endswith(f"/projects/{PROJECT}/locations/us-west4-a/clusters/"
                                      "tpuserve-fleet")
    assert "resourceLabels" not in every["clusters"][0] and "missingZones" not in every
    zone = _get(gke, f"v1/projects/{PROJECT_NUMBER}/locations/us-west4-a/clusters").json()
    assert [c["name"] for c in zone["clusters"]] == ["tpuserve-fleet"]
    assert _get(gke, f"v1/projects/{PROJECT}/locations/us-east1-b/clusters").json() == {}


def test_missing_zones_leave_their_clusters_out_and_are_named(gke) -> None:
    gke.add_cluster("us-west4-a", "tpuserve-fleet", labels=OURS)
    gke.add_cluster("us-west4", "regional")
    gke.missing_zones.add("us-west4-a")
    assert _get(gke, f"v1/projects/{PROJECT}/locations/-/clusters").json() == {
        "missingZones": ["us-west4-a"]}
    assert _get(gke, f"v1/projects/{PROJECT}/locations/us-east1/clusters").json() == {}


def test_server_config_has_channels_with_valid_versions(gke) -> None:
    gke.channels = {"REGULAR": ["1.34.1-gke.1", "1.33.9-gke.2"], "STABLE": ["1.33.9-gke.2"]}
    config = _get(gke, f"v1/projects/{PROJECT}/locations/us-west4-a/serverConfig").json()
    assert config["channels"] == [
        {"channel": "REGULAR", "defaultVersion": "1.34.1-gke.1",
         "validVersions": ["1.34.1-gke.1", "1.33.9-gke.2"], "upgradeTargetVersion": "1.34.1-gke.1"},
        {"channel": "STABLE", "defaultVersion": "1.33.9-gke.2",
         "validVersions": ["1.33.9-gke.2"], "upgradeTargetVersion": "1.33.9-gke.2"}]
    assert config["validMasterVersions"] == ["1.34.1-gke.1", "1.33.9-gke.2"]
    assert config["defaultClusterVersion"] == "1.34.1-gke.1"


def test_errors_are_google_rpc_status(gke) -> None:
    path = f"v1/projects/{PROJECT}/locations/-/clusters"
    assert _get(gke, path, token=None).json()["error"]["status"] == "UNAUTHENTICATED"
    bad = _get(gke, path, pageSize="5").json()["error"]
    assert bad["code"] == 400 and 'Unknown name "pageSize"' in bad["message"]
    assert _get(gke, path, prettyPrint="false", projectId=PROJECT).status_code == 200
    other = _get(gke, "v1/projects/someone-else/locations/-/clusters").json()["error"]
    assert other["code"] == 403 and other["details"][0]["reason"] == "IAM_PERMISSION_DENIED"
    gke.disabled, gke.consumer_number = True, "999"
    off = _get(gke, path).json()["error"]
    assert off["code"] == 403 and "has not been used in project 999" in off["message"]
    assert off["details"][0]["reason"] == "SERVICE_DISABLED"
    assert off["details"][0]["metadata"]["consumer"] == "projects/999"


def test_faults_answer_the_next_requests(gke) -> None:
    path = f"v1/projects/{PROJECT}/locations/-/clusters"
    gke.answer_next(302, headers={"Location": "http://127.0.0.1:9/x"})
    gke.answer_next(200, b"null")
    gke.fail_next(503, "UNAVAILABLE", "try again")
    first = _get(gke, path)
    assert first.status_code == 302 and first.headers["Location"] == "http://127.0.0.1:9/x"
    assert _get(gke, path).text == "null"
    assert _get(gke, path).json()["error"]["status"] == "UNAVAILABLE"
    assert _get(gke, path).json() == {}
    assert [c.status for c in gke.calls_of("clusters")] == [302, 200, 503, 200]


def test_requests_and_answers_are_checked_against_the_discovery_document(gke) -> None:
    from tests.fakes.discovery import Discovery

    path = f"v1/projects/{PROJECT}/locations/-/clusters"
    wrong = requests.post(f"{gke.endpoint}{path}", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=5)  # clusters.create is POST .../clusters with a body
    assert wrong.status_code == 501 and wrong.json()["error"]["status"] == "UNIMPLEMENTED"
    assert _get(gke, f"v1/projects/{PROJECT}/clusters").status_code == 404  # no such method
    assert "text/html" in _get(gke, f"v1/projects/{PROJECT}/clusters").headers["Content-Type"]
    gke.add_cluster("us-west4-a", "odd").status = "SLEEPING"  # not in Cluster.status's enum
    doc = Discovery.load("container", "v1")
    before = len(doc.violations)
    refused = _get(gke, path)
    assert refused.status_code == 500 and "Cluster" in refused.json()["error"]["message"]
    assert len(doc.violations) == before + 1
    del doc.violations[before:]  # seen: not a failure of this test
