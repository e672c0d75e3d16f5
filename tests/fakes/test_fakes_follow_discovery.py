"""Each fake of a Google REST API, over HTTP, refuses what its discovery document refuses (an
unknown field, a wrong enum value, a read-only field) with Google's error JSON, and a normal
answer that its document would refuse fails loudly (tests/fakes/discovery.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from tests.fakes.cloud_tasks import FakeCloudTasks
from tests.fakes.compute import FakeCompute
from tests.fakes.container import FakeContainer
from tests.fakes.discovery import Discovery, _read_only
from tests.fakes.iam import FakeIam
from tests.fakes.resourcemanager import FakeResourceManager
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.serviceusage import FakeServiceUsage
from tests.fakes.storage import FakeStorage
from tests.fakes.tpu_api import FakeTpuApi, flex_body

TOKEN = "ya29.fake-token"
PROJECT, ZONE = "proj-test-1", "us-west4-a"
NUMBER = "123456789012"
QUEUE = f"projects/{PROJECT}/locations/us-west4/queues/tpuserve-guard"
SA = f"guard@{PROJECT}.iam.gserviceaccount.com"


@dataclass(frozen=True)
class Write:
    """One documented write of a fake: a valid body, and what breaks it three ways."""

    fake: str
    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    unknown: Callable[[dict[str, Any]], None]
    enum: Callable[[dict[str, Any]], None] | None      # None: no writable enum in the body
    read_only: Callable[[dict[str, Any]], None] | None  # None: the document marks none
    answers: int  # what the valid body gets (the fake's own answer; 404: not served)


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        target = body
        for key in keys[:-1]:
            target = target[key][0] if isinstance(target[key], list) else target[key]
        target[keys[-1]] = value
    return mutate


QR_PATH = f"v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources"
NODE_PATH = f"v2/projects/{PROJECT}/locations/{ZONE}/nodes/n1"
TASK = {"task": {"name": f"{QUEUE}/tasks/t1", "scheduleTime": "2026-01-01T01:00:00Z",
                 "httpRequest": {"url": "https://tpu.googleapis.com/v2/x", "httpMethod": "DELETE",
                                 "oauthToken": {"serviceAccountEmail": SA}}}}
WRITES = [
    Write("tpu", "POST", QR_PATH, {"queuedResourceId": "q1"}, flex_body(PROJECT, ZONE, "q1"),
          _set("tpu", "nodeSpec", "node", "colour", value="red"),
          _set("provisioningModel", value="FLEX"),
          _set("state", value={"state": "ACTIVE"}), 200),
    Write("tpu", "PATCH", NODE_PATH, {"updateMask": "metadata"}, {"metadata": {"k": "v"}},
          _set("colour", value="red"),
          _set("acceleratorConfig", value={"type": "V9"}),
          _set("networkEndpoints", value=[{"ipAddress": "10.0.0.1"}]), 200),
    # Storage's endpoint is the JSON API's root, .../storage/v1/.
    Write("storage", "PATCH", "b/bkt/o/obj", {}, {"customTime": "2026-01-01T00:00:00Z"},
          _set("colour", value="red"), None, None, 200),
    Write("cloudtasks", "POST", f"v2/{QUEUE}/tasks", {}, TASK,
          _set("task", "colour", value="red"),
          _set("task", "httpRequest", "httpMethod", value="FETCH"),
          _set("task", "createTime", value="2026-01-01T00:00:00Z"), 200),
    # Secret Manager and IAM: the fakes serve reads only; a write the document accepts reaches
    # the fake (which does not serve it: 404), one it refuses never does.
    Write("secretmanager", "POST", f"v1/projects/{PROJECT}/secrets", {"secretId": "s"},
          {"replication": {"automatic": {}}},
          _set("colour", value="red"), _set("secretType", value="PASSWORD"),
          _set("createTime", value="2026-01-01T00:00:00Z"), 404),
    Write("iam", "POST", f"v1/projects/{PROJECT}/serviceAccounts", {},
          {"accountId": "guard", "serviceAccount": {"displayName": "g"}},
          _set("colour", value="red"), None,
          _set("serviceAccount", "uniqueId", value="1"), 404),
    # The read-only fakes (Container, Resource Manager, Compute, Service Usage): a documented
    # write reaches the fake, which does not serve it (501, 404); one the document refuses
    # never does.
    Write("container", "POST", f"v1/projects/{PROJECT}/locations/us-west4/clusters", {},
          {"cluster": {"name": "c", "releaseChannel": {"channel": "REGULAR"}}},
          _set("cluster", "colour", value="red"),
          _set("cluster", "releaseChannel", "channel", value="FASTEST"),
          _set("cluster", "createTime", value="2026-01-01T00:00:00Z"), 501),
    Write("cloudresourcemanager", "POST", "v1/projects", {}, {"projectId": "proj-new-1"},
          _set("colour", value="red"), None,  # the wrong enum: setIamPolicy's, below
          _set("configuredCapabilities", value=["x"]), 404),
    Write("cloudresourcemanager", "POST", f"v1/projects/{PROJECT}:setIamPolicy", {},
          {"policy": {"auditConfigs": [{"service": "allServices",
                                        "auditLogConfigs": [{"logType": "DATA_READ"}]}]}},
          _set("policy", "colour", value="red"),
          _set("policy", "auditConfigs", "auditLogConfigs", "logType", value="ALL"), None, 404),
    # Compute's endpoint is .../compute/v1/, as gcloud's override carries the path.
    Write("compute", "POST", f"projects/{PROJECT}/zones/{ZONE}/instances", {},
          {"name": "i", "privateIpv6GoogleAccess": "INHERIT_FROM_SUBNETWORK"},
          _set("colour", value="red"), _set("privateIpv6GoogleAccess", value="NEVER"),
          _set("creationTimestamp", value="2026-01-01T00:00:00.000-08:00"), 404),
    Write("serviceusage", "POST", f"v1/projects/{NUMBER}/services/tpu.googleapis.com:disable",
          {}, {"checkIfServiceHasUsage": "CHECK"},
          _set("colour", value="red"), _set("checkIfServiceHasUsage", value="MAYBE"), None, 404),
]


@pytest.fixture
def fakes() -> Iterator[dict[str, str]]:
    """Every fake, started and seeded; name -> endpoint."""
    tpu = FakeTpuApi(token=TOKEN).start()
    tpu.seed_node(PROJECT, ZONE, "n1")
    storage = FakeStorage(bucket="bkt", access_token=TOKEN).start()
    storage.put("obj", b"data")
    tasks = FakeCloudTasks(token=TOKEN, clock=lambda: 1_767_225_600).start()
    tasks.add_queue(QUEUE)
    secrets = FakeSecretManager(project=PROJECT, access_token=TOKEN).start()
    iam = FakeIam(project=PROJECT, access_token=TOKEN).start()
    gke = FakeContainer(project=PROJECT, access_token=TOKEN, project_number=NUMBER).start()
    crm = FakeResourceManager(project=PROJECT, number=NUMBER, access_token=TOKEN).start()
    compute = FakeCompute(project=PROJECT, access_token=TOKEN).start()
    usage = FakeServiceUsage(project=PROJECT, number=NUMBER, access_token=TOKEN).start()
    try:
        yield {"tpu": tpu.url, "storage": storage.endpoint, "cloudtasks": tasks.url,
               "secretmanager": secrets.endpoint, "iam": iam.endpoint, "container": gke.endpoint,
               "cloudresourcemanager": crm.endpoint, "compute": compute.endpoint,
               "serviceusage": usage.endpoint}
    finally:
        for fake in (tpu, storage, tasks, secrets, iam, gke, crm, compute, usage):
            fake.stop()


def _send(url: str, w: Write, body: dict[str, Any], query: dict[str, str] | None = None,
          ) -> requests.Response:
    return requests.request(w.method, f"{url}{w.path}", params=query or w.query, json=body,
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)


def _refused(response: requests.Response, needle: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and needle in error["message"], error
    return error


@pytest.mark.parametrize("w", WRITES, ids=lambda w: f"{w.fake}-{w.method}")
def test_each_fake_takes_the_documented_body(fakes: dict[str, str], w: Write) -> None:
    assert _send(fakes[w.fake], w, w.body).status_code == w.answers


@pytest.mark.parametrize("w", WRITES, ids=lambda w: f"{w.fake}-{w.method}")
def test_each_fake_refuses_an_unknown_field(fakes: dict[str, str], w: Write) -> None:
    body = copy.deepcopy(w.body)
    w.unknown(body)
    error = _refused(_send(fakes[w.fake], w, body), 'Unknown name "colour"')
    if w.fake != "storage":  # One Platform: google.rpc.Status with a BadRequest detail
        assert error["status"] == "INVALID_ARGUMENT"
        assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    else:  # the JSON API's own shape
        assert error["errors"][0]["reason"] == "invalid"


@pytest.mark.parametrize("w", [w for w in WRITES if w.enum], ids=lambda w: f"{w.fake}-{w.method}")
def test_each_fake_refuses_a_wrong_enum_value(fakes: dict[str, str], w: Write) -> None:
    body = copy.deepcopy(w.body)
    assert w.enum is not None
    w.enum(body)
    _refused(_send(fakes[w.fake], w, body), "enum, one of")


@pytest.mark.parametrize("w", [w for w in WRITES if w.read_only],
                         ids=lambda w: f"{w.fake}-{w.method}")
def test_each_fake_refuses_a_read_only_field(fakes: dict[str, str], w: Write) -> None:
    body = copy.deepcopy(w.body)
    assert w.read_only is not None
    w.read_only(body)
    _refused(_send(fakes[w.fake], w, body), "is output only")


@pytest.mark.parametrize("w", WRITES, ids=lambda w: f"{w.fake}-{w.method}")
def test_each_fake_refuses_a_wrong_enum_in_a_query_parameter(fakes: dict[str, str],
                                                             w: Write) -> None:
    """Where a body has no writable enum (Storage's Object, IAM's create), the query has one:
    the standard `alt`, and Storage's own `projection`."""
    _refused(_send(fakes[w.fake], w, w.body, {**w.query, "alt": "xml"}), "enum, one of")
    if w.fake == "storage":
        _refused(_send(fakes[w.fake], w, w.body, {"projection": "most"}), "enum, one of")


def test_the_documents_name_no_writable_enum_or_read_only_field_where_the_table_says_so(
) -> None:
    """The table above leaves a rule out only where the document has nothing to test."""
    storage = Discovery.load("storage", "v1").schemas["Object"]["properties"]
    assert not any("enum" in p or p.get("readOnly") for p in storage.values())
    iam = Discovery.load("iam", "v1").schemas
    for ref in ("CreateServiceAccountRequest", "ServiceAccount"):
        assert not any("enum" in p for p in iam[ref]["properties"].values())
    for api, ref in (("cloudresourcemanager", "SetIamPolicyRequest"),
                     ("cloudresourcemanager", "Policy"), ("cloudresourcemanager", "AuditConfig"),
                     ("cloudresourcemanager", "AuditLogConfig"),
                     ("serviceusage", "DisableServiceRequest")):
        props = Discovery.load(api, "v1").schemas[ref]["properties"].values()
        assert not any(_read_only(p) for p in props), (api, ref)


@pytest.mark.parametrize("fake,path", [
    ("tpu", f"v2/projects/{PROJECT}/locations/{ZONE}/widgets"),
    ("storage", "b/bkt/widgets"),
    ("cloudtasks", f"v2/{QUEUE}/widgets"),
    ("secretmanager", f"v1/projects/{PROJECT}/widgets"),
    ("iam", f"v1/projects/{PROJECT}/widgets"),
    ("container", f"v1/projects/{PROJECT}/locations/us-west4/widgets"),
    ("cloudresourcemanager", f"v1/projects/{PROJECT}/widgets"),
    ("compute", f"projects/{PROJECT}/widgets"),
    ("serviceusage", f"v1/projects/{NUMBER}/widgets"),
])
def test_each_fake_answers_an_undocumented_path_as_googles_front_end(
        fakes: dict[str, str], fake: str, path: str) -> None:
    answer = requests.get(f"{fakes[fake]}{path}", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=10)
    assert answer.status_code == 404 and "That\u2019s an error." in answer.text


def test_tpu_v2_and_v2alpha1_are_checked_each_against_its_own_document(
        fakes: dict[str, str]) -> None:
    """bootDiskConfig.diskSizeGb exists in v2alpha1 only (the fake's old hand-kept schema had
    it in both)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"bootDiskConfig": {"diskSizeGb": "100"}}
    for version, code in (("v2", 400), ("v2alpha1", 200)):
        answer = requests.patch(
            f"{fakes['tpu']}{version}/projects/{PROJECT}/locations/{ZONE}/nodes/n1",
            params={"updateMask": "labels"}, json=body, headers=headers, timeout=10)
        unknown = 'Unknown name \\"diskSizeGb\\"' in answer.text
        assert (answer.status_code, unknown) == ((400, True) if code == 400 else (200, False))


def test_a_fake_answer_its_document_refuses_fails_loudly(fakes: dict[str, str]) -> None:
    """A TPU node in a state Google never reports: the answer is a 500 naming the violation,
    and the suite's autouse check would fail the test (cleared here: provoked on purpose)."""
    api = FakeTpuApi(token=TOKEN).start()
    doc = Discovery.load("tpu", "v2")
    before = len(doc.violations)
    try:
        api.seed_node(PROJECT, ZONE, "n2", state="SLEEPY")
        answer = requests.get(f"{api.url}v2/projects/{PROJECT}/locations/{ZONE}/nodes/n2",
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    finally:
        api.stop()
    assert answer.status_code == 500
    assert "SLEEPY" in answer.json()["error"]["message"]
    assert len(doc.violations) == before + 1
    del doc.violations[before:]
