"""The queued-resource client, its CLI and the shared Google API edge, against the fake TPU API.

Time is injected: the client's sleep advances a fake clock and (where a test says so) the
fake's state machine, so no test sleeps.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from tests.fakes.tpu_api import ZERO_DURATIONS, FakeTpuApi, flex_body
from tpuserve.gcp import api as google_api
from tpuserve.gcp.api import ApiError, CredentialsError, api_root, authorized_session
from tpuserve.gcp.queued_resource import (
    GENERATION_LABEL,
    MISSING,
    BodyError,
    QueuedResourceError,
    QueuedResourceRef,
    SpecMismatch,
    StatePrinter,
    TpuClient,
    WaitTimeout,
    build_body,
    check_body,
    main,
    new_generation,
    probe,
    ref_for,
    spec_differences,
    with_generation,
)
from tpuserve.settings import ConfigError, Deployment, from_raw, load_raw
from tpuserve.settings.warnings import deployment_warnings

PROJECT, ZONE, QR_ID = "proj-test-1", "us-west4-a", "tpuserve-flex"
REF = QueuedResourceRef(PROJECT, ZONE, QR_ID)
SCRIPT = '#!/bin/bash\nset -euo pipefail\necho "${HOME:-/root}" %{x}\n'


class Clock:
    """A fake monotonic clock; `sleep` advances it and runs the hooks (e.g. api.advance)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.hooks: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        for hook in self.hooks:
            hook()


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(api: FakeTpuApi, clock: Clock) -> TpuClient:
    return TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)


def body(**kw: Any) -> dict[str, Any]:
    return flex_body(PROJECT, ZONE, QR_ID, **kw)


class Seen:
    """A Progress callback that records states."""

    def __init__(self) -> None:
        self.states: list[str] = []

    def __call__(self, state: str, elapsed: float) -> None:
        if not self.states or self.states[-1] != state:
            self.states.append(state)


# ---------------------------------------------------------------- the body


def flex_deployment(**stack: Any) -> Deployment:
    raw = load_raw(environ={})
    raw["stacks"] = {"flex": {**raw["stacks"]["flex"], **stack}}
    return from_raw(raw).deployments["flex"]


def test_build_body_is_the_documented_flex_start_shape() -> None:
    d = flex_deployment()
    assert build_body(d, SCRIPT) == {
        "provisioningModel": "FLEX_START",
        "runDuration": {"maxRunDuration": "14400s"},
        "tpu": {"nodeSpec": [{
            "parent": "projects/tpuserve-placeholder/locations/us-west4-a",
            "nodeId": "tpuserve-flex",
            "node": {
                "acceleratorType": "v5litepod-1",
                "runtimeVersion": "v2-alpha-tpuv5-lite",
                # The deployment's own network and subnet (issue 10 section 3).
                "networkConfig": {"network": "tpuserve-net",
                                  "subnetwork": "tpuserve-net-us-west4",
                                  "enableExternalIps": True},
                "shieldedInstanceConfig": {"enableSecureBoot": True},
                "metadata": {"startup-script": SCRIPT, "enable-guest-attributes": "TRUE",
                             "enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"},
                "serviceAccount": {
                    "email": "tpuserve-flex-vm@tpuserve-placeholder.iam.gserviceaccount.com",
                    "scope": ["https://www.googleapis.com/auth/cloud-platform"],
                },
                "tags": ["tpuserve-flex"],
                "labels": {"stack": "flex", "model": "google-gemma-4-e2b-it",
                           "provisioning-model": "flex", "managed-by": "tpuserve"},
            },
        }]},
    }
    assert ref_for(d).name == ("projects/tpuserve-placeholder/locations/us-west4-a/"
                               "queuedResources/tpuserve-flex")


def test_build_body_durations_and_queueing_policy() -> None:
    d = flex_deployment(max_run_duration="1h30m", valid_until_duration="2h")
    out = build_body(d, SCRIPT)
    assert out["runDuration"] == {"maxRunDuration": "5400s"}
    assert out["queueingPolicy"] == {"validUntilDuration": "7200s"}


def test_build_body_refuses_other_stacks() -> None:
    spot = from_raw(load_raw(environ={})).deployments["spot"]
    with pytest.raises(ValueError, match="flex stack only"):
        build_body(spot, SCRIPT)


def test_generation_label_and_token() -> None:
    token = new_generation(now=0)
    assert token.startswith("19700101-000000-") and len(token) == 20
    labelled = with_generation(body(), token)
    assert labelled["tpu"]["nodeSpec"][0]["node"]["labels"][GENERATION_LABEL] == token
    assert GENERATION_LABEL not in body()["tpu"]["nodeSpec"][0]["node"]["labels"]  # a copy
    with pytest.raises(ValueError, match="label value"):
        with_generation(body(), "Not A Label")


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda b: b.pop("tpu"), "nodeSpec must be a non-empty list"),
    (lambda b: b["tpu"]["nodeSpec"][0].pop("nodeId"), "nodeId is required"),
    (lambda b: b["tpu"]["nodeSpec"][0].update(parent="projects/x/locations/y"),
     "must be 'projects/proj-test-1/locations/us-west4-a'"),
])
def test_check_body_rejects_bad_input(mutate: Callable[[dict], Any], match: str) -> None:
    b = body()
    mutate(b)
    with pytest.raises(BodyError, match=match):
        check_body(REF, b)


def test_names_are_validated() -> None:
    assert QueuedResourceRef.parse(REF.name) == REF
    with pytest.raises(ValueError, match="must look like"):
        QueuedResourceRef.parse("projects/p/zones/z/queuedResources/q")
    with pytest.raises(ValueError, match="lowercase"):
        QueuedResourceRef(PROJECT, ZONE, "Bad_Id")


def test_spec_differences() -> None:
    live = body()
    live["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["network"] = (
        "projects/proj-test-1/global/networks/default")  # the API may answer with the URL
    live["state"] = {"state": "ACTIVE"}  # output-only fields are ignored
    assert spec_differences(body(), live) == []
    mine = flex_deployment()
    wanted = build_body(mine, SCRIPT)
    answered = build_body(mine, SCRIPT)
    answered["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["subnetwork"] = (
        "projects/tpuserve-placeholder/regions/us-west4/subnetworks/tpuserve-net-us-west4")
    assert spec_differences(wanted, answered) == []
    other = body(max_run_duration="7200s", startup_script="#!/bin/bash\n" + "x" * 100)
    diffs = spec_differences(body(), other)
    assert diffs[0] == "runDuration.maxRunDuration: '7200s', want '14400s'"
    assert diffs[1].startswith("tpu.nodeSpec[0].node.metadata.startup-script: <112 chars, sha256")


# ---------------------------------------------------------------- create


def test_create_posts_the_body_and_returns_once_accepted(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    wanted = with_generation(body(), "gen-1")
    seen = Seen()
    result = client.create_queued_resource(REF, wanted, on_progress=seen)
    assert (result.adopted, result.queued_resource.state) == (False, "ACCEPTED")
    assert result.queued_resource.generation == "gen-1"
    [post] = api.calls("POST")
    assert post.path == f"/v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources"
    assert post.query == {"queuedResourceId": QR_ID}
    assert post.body == wanted and post.authorized
    assert seen.states == ["CREATING", "ACCEPTED"]
    assert clock.slept == [5.0]  # one poll interval: no busy loop, no real sleep


def test_create_adopts_a_live_qr_with_the_same_spec(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(), generation="gen-1")
    result = client.create_queued_resource(REF, with_generation(body(), "gen-1"))
    assert result.adopted and result.queued_resource.state == "WAITING_FOR_RESOURCES"
    assert not api.calls("POST")


def test_create_refuses_a_live_qr_with_another_spec(api, client) -> None:
    other = body(max_run_duration="7200s")
    other["tpu"]["nodeSpec"][0]["node"]["acceleratorType"] = "v5litepod-4"
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=other)
    with pytest.raises(SpecMismatch) as err:
        client.create_queued_resource(REF, body())
    assert err.value.differences == [
        "runDuration.maxRunDuration: '7200s', want '14400s'",
        "tpu.nodeSpec[0].node.acceleratorType: 'v5litepod-4', want 'v5litepod-1'",
    ]
    assert "\n" not in str(err.value) and "delete it" in str(err.value)
    assert not api.calls("POST") and not api.calls("DELETE")


@pytest.mark.parametrize("dead", ["SUSPENDED", "FAILED"])
def test_create_replaces_a_dead_qr(api, client, clock, dead: str) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state=dead, body=body(), generation="old")
    result = client.create_queued_resource(REF, with_generation(body(), "new"))
    assert result.queued_resource.generation == "new" and not result.adopted
    methods = [r.method for r in api.requests if r.method != "GET"]
    assert methods == ["DELETE", "POST"]  # the dead one holds the name: delete first


def test_create_that_loses_a_race_judges_what_exists(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="g")
    # The first look says "missing" (another deploy is creating it right now): the POST gets a
    # real 409 from the fake, and the client compares the QR that won.
    api.fail_next(404, "NOT_FOUND", "not yet", method="GET")
    result = client.create_queued_resource(REF, with_generation(body(), "g"))
    assert result.adopted
    assert len(api.calls("POST")) == 1


def test_duplicate_create_is_409_already_exists(api, client) -> None:
    api.fail_next(404, "NOT_FOUND", "not yet", method="GET", times=2)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, body())
    # the re-read after the 409 was also 404 (fault injected): the 409 itself surfaces
    assert (err.value.code, err.value.status) == (409, "ALREADY_EXISTS")
    assert "already exists" in str(err.value) and "\n" not in str(err.value)


def test_create_operation_error_is_one_line_with_advice(api, client) -> None:
    api.fail_next_create_operation(
        9, 'FLEX_START provisioning model is not supported for accelerator type "v5litepod-1"')
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, body())
    text = str(err.value)
    assert text.startswith(f"create queued resource {REF.name}: 400 FAILED_PRECONDITION: FLEX")
    assert "us-west4-a accepted v5litepod-1" in text and "\n" not in text


def test_create_times_out_while_creating_and_leaves_the_qr_to_adopt(api, client, clock) -> None:
    with pytest.raises(WaitTimeout, match="is CREATING after 30 s, not ACCEPTED") as err:
        client.create_queued_resource(REF, body(), timeout=30)
    # Not a definitive outcome: the QR keeps its place in the queue, and the error says how
    # to resume.
    [note] = err.value.__notes__
    assert "was left in place" in note and "cdktf deploy flex" in note and "adopt" in note
    assert not api.calls("DELETE") and api.state_of(QR_ID) == "CREATING"
    api.advance()
    assert client.create_queued_resource(REF, body()).adopted is True
    assert len(api.calls("POST")) == 1


def test_a_failed_create_removes_what_it_made(api, client, clock) -> None:
    def fail_then_advance() -> None:
        if api.state_of(QR_ID) == "CREATING":
            api.set_state(QR_ID, "FAILED", failure="no capacity in zone")
        else:
            api.advance()

    clock.hooks.append(fail_then_advance)
    with pytest.raises(QueuedResourceError, match="is FAILED: no capacity in zone") as err:
        client.create_queued_resource(REF, body())
    assert err.value.__notes__ == ["the queued resource this create made was deleted again"]
    assert api.state_of(QR_ID) is None  # nothing left that could provision and bill later


def test_a_failed_adopted_create_leaves_the_qr_alone(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="CREATING", body=body())
    with pytest.raises(WaitTimeout):
        client.create_queued_resource(REF, body(), timeout=10)
    assert not api.calls("DELETE") and api.state_of(QR_ID) == "CREATING"


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


def test_client_reports_a_rejected_body_on_one_line(api, client) -> None:
    b = body()
    b["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["enable_external_ips"] = True
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, b)
    assert err.value.code == 400 and "Unknown name" in str(err.value)
    assert "fix the setting the message names" in str(err.value)


# ---------------------------------------------------------------- get / wait


def test_get_missing_and_live(api, client) -> None:
    assert client.get_queued_resource(REF) is None
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="g7")
    qr = client.get_queued_resource(REF)
    assert (qr.name, qr.state, qr.generation, qr.node_ids) == (REF.name, "ACTIVE", "g7",
                                                               [QR_ID])
    assert [q.name for q in client.list_queued_resources(PROJECT, ZONE)] == [REF.name]


def test_wait_for_active_shows_progress(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="ACCEPTED", body=body())
    out = io.StringIO()
    qr = client.wait_for_state(REF, {"ACTIVE"}, timeout=600,
                               on_progress=StatePrinter("qr tpuserve-flex", out))
    assert qr is not None and qr.state == "ACTIVE"
    assert out.getvalue().splitlines() == [
        "tpuserve: qr tpuserve-flex: ACCEPTED (0 s)",
        "tpuserve: qr tpuserve-flex: WAITING_FOR_RESOURCES (5 s)",
        "tpuserve: qr tpuserve-flex: PROVISIONING (10 s)",
        "tpuserve: qr tpuserve-flex: ACTIVE (15 s)",
    ]


def test_wait_for_state_timeout_and_dead_states(api, client, clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES", body=body())
    with pytest.raises(WaitTimeout, match="is WAITING_FOR_RESOURCES after 60 s, not ACTIVE"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    api.set_state(QR_ID, "SUSPENDED")
    with pytest.raises(QueuedResourceError, match="is SUSPENDED -> deploy again"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    api.remove_queued_resource(QR_ID)
    with pytest.raises(QueuedResourceError, match="disappeared while waiting for ACTIVE"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    assert client.wait_for_state(REF, {MISSING}, timeout=0) is None


def test_wait_operation(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    resp = requests.post(
        f"{api.url}v2alpha1/{REF.parent}/queuedResources", params={"queuedResourceId": QR_ID},
        json=body(), headers={"Authorization": f"Bearer {api.token}"}, timeout=5,
    ).json()
    assert resp["done"] is False
    assert resp["name"].startswith(f"{REF.parent}/operations/operation-")
    assert resp["metadata"]["verb"] == "create" and resp["metadata"]["target"] == REF.name
    result = client.wait_operation(resp, timeout=60)
    assert result["name"] == REF.name and result["state"]["state"] == "ACCEPTED"
    with pytest.raises(WaitTimeout, match="not done after 0 s"):
        client.wait_operation({"name": resp["name"] + "x", "done": False}, timeout=0)
    with pytest.raises(ApiError, match="429 RESOURCE_EXHAUSTED: quota"):
        client.wait_operation({"name": "n", "done": True,
                               "error": {"code": 8, "message": "quota"}}, timeout=1)


# ---------------------------------------------------------------- delete


def test_delete_forces_and_waits_until_gone(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    assert client.get_node(PROJECT, ZONE, QR_ID) is not None
    seen = Seen()
    assert client.delete_queued_resource(REF, on_progress=seen) is True
    [delete] = api.calls("DELETE")
    assert delete.query == {"force": "true"}
    assert seen.states == ["ACTIVE", "DELETING", MISSING]
    assert client.get_queued_resource(REF) is None
    assert client.get_node(PROJECT, ZONE, QR_ID) is None  # force: the node went first


def test_delete_of_a_missing_qr_is_success(api, client) -> None:
    assert client.delete_queued_resource(REF) is False
    assert not api.calls("DELETE")
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    api.fail_next(404, "NOT_FOUND", "gone meanwhile", method="DELETE")
    assert client.delete_queued_resource(REF) is False


def test_delete_waits_out_provisioning_and_retries(api, client, clock) -> None:
    clock.hooks.append(lambda: api.advance(QR_ID))
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING", body=body())
    seen = Seen()
    assert client.delete_queued_resource(REF, on_progress=seen) is True
    refused, accepted = api.calls("DELETE")
    assert (refused.method, accepted.method) == ("DELETE", "DELETE")
    assert seen.states[0] == "PROVISIONING"
    assert seen.states[1].startswith("PROVISIONING (cannot be deleted until provisioning ends")
    assert seen.states[2:] == ["ACTIVE", "DELETING", MISSING]


def test_delete_gives_up_on_provisioning_after_its_timeout(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING", body=body())
    with pytest.raises(WaitTimeout) as err:
        client.delete_queued_resource(REF, timeout=20)
    assert "still PROVISIONING after 20 s" in str(err.value) and "\n" not in str(err.value)
    assert len(api.calls("DELETE")) >= 2


def test_delete_of_a_deleting_qr_only_waits(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="DELETING", body=body())
    assert client.delete_queued_resource(REF) is True
    assert not api.calls("DELETE")


def test_delete_without_force_is_refused_while_the_node_exists(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    with pytest.raises(ApiError, match=r"FAILED_PRECONDITION: .* still has nodes"):
        client.delete_queued_resource(REF, force=False)


# ---------------------------------------------------------------- API errors


@pytest.mark.parametrize(("code", "status", "advice"), [
    (403, "PERMISSION_DENIED", "gcloud services enable tpu.googleapis.com"),
    (429, "RESOURCE_EXHAUSTED", "preemptible TPU quota"),
    (401, "UNAUTHENTICATED", "was refused or has expired"),
    (500, "INTERNAL", "retry in a minute"),
])
def test_api_errors_are_one_line_with_what_to_do(api, client, code, status, advice) -> None:
    # times=50: transient ones (429, 500) are retried first, then reported the same way.
    api.fail_next(code, status, "Permission 'tpu.queuedResources.get' denied\non resource",
                  times=50)
    with pytest.raises(ApiError) as err:
        client.get_queued_resource(REF)
    text = str(err.value)
    assert text.startswith(f"get queued resource {REF.name}: {code} {status}: Permission")
    assert advice in text and "\n" not in text


def test_gateway_errors_are_retried(api, client, clock) -> None:
    api.fail_next(503, "UNAVAILABLE", "try again", times=2)
    assert client.get_queued_resource(REF) is None
    # Full jitter: each pause is uniform in [0, 1 s doubling]; never above its step.
    assert len(clock.slept) == 2 and clock.slept[0] <= 1.0 and clock.slept[1] <= 2.0


def test_unreachable_api_is_one_line(clock) -> None:
    dead = TpuClient(root="http://127.0.0.1:9/", environ={"CLOUDSDK_AUTH_ACCESS_TOKEN": "t"},
                     clock=clock, sleep=clock.sleep)
    with pytest.raises(ApiError) as err:
        dead.get_queued_resource(REF)
    assert err.value.code == 0 and "could not reach tpu.googleapis.com" in str(err.value)


def test_api_root_follows_gcloud_variables() -> None:
    assert api_root("tpu", google_api.TPU_API, {}) == "https://tpu.googleapis.com/"
    env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": "http://127.0.0.1:8123"}
    assert api_root("secretmanager", google_api.SECRETMANAGER_API, env) == (
        "http://127.0.0.1:8123/")
    bad = re.escape("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU = 'tpu.local'")
    with pytest.raises(ValueError, match=bad):
        api_root("tpu", google_api.TPU_API, {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": "tpu.local"})


def test_credentials_token_variable_else_adc(monkeypatch) -> None:
    session = authorized_session({"CLOUDSDK_AUTH_ACCESS_TOKEN": "tok-123"})
    assert session.headers["Authorization"] == "Bearer tok-123"
    import google.auth
    import google.auth.exceptions

    def no_adc(**_: Any) -> None:
        raise google.auth.exceptions.DefaultCredentialsError("Could not find credentials")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(CredentialsError) as err:
        authorized_session({})
    assert "application-default login" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- nodes


def test_node_state_external_ip_and_guest_attributes(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    for version in ("v2", "v2alpha1"):
        node = client.get_node(PROJECT, ZONE, QR_ID, api_version=version)
        assert node is not None and node.state == "READY"
        assert node.external_ip and node.external_ip.startswith("203.0.113.")
        assert node.raw["queuedResource"] == REF.name
    api.set_guest_attribute(QR_ID, "phase", "serving")
    api.set_guest_attribute(QR_ID, "boot", "857", namespace="timing")
    assert client.get_guest_attributes(PROJECT, ZONE, QR_ID) == {
        "timing/boot": "857", "tpuserve/phase": "serving"}
    assert client.get_guest_attributes(PROJECT, ZONE, QR_ID, "tpuserve/") == {
        "tpuserve/phase": "serving"}
    assert client.get_guest_attributes(PROJECT, ZONE, QR_ID, "tpuserve/none") == {}
    [ga] = api.calls("POST", ":getGuestAttributes")[:1]
    assert ga.body == {"queryPath": ""}
    spot = api.seed_node(PROJECT, ZONE, "tpuserve-spot", external_ip=None)
    assert client.get_node(PROJECT, ZONE, "tpuserve-spot").external_ip is None
    assert [n.name for n in client.list_nodes(PROJECT, ZONE)] == [
        f"{REF.parent}/nodes/tpuserve-flex", spot]


def test_run_duration_ends_in_suspended_with_the_node_deleted(clock) -> None:
    with FakeTpuApi(durations=ZERO_DURATIONS, clock=clock) as api:
        c = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep)
        c.create_queued_resource(REF, body(max_run_duration="3600s"))
        assert c.get_queued_resource(REF).state == "ACTIVE"  # zero durations: at once
        clock.now += 3599
        assert c.get_node(PROJECT, ZONE, QR_ID).state == "READY"
        clock.now += 1
        assert c.get_queued_resource(REF).state == "SUSPENDED"
        assert c.get_node(PROJECT, ZONE, QR_ID) is None


# ---------------------------------------------------------------- the CLI


def run_cli(argv: list[str], env: dict[str, str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, environ=env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def fast_api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi(durations=ZERO_DURATIONS) as server:
        yield server


@pytest.fixture
def env(fast_api: FakeTpuApi) -> dict[str, str]:
    return {**fast_api.environ(), "TPUSERVE_QR_NAME": REF.name, "TPUSERVE_QR_POLL_SECONDS": "0"}


def test_cli_create_then_delete(fast_api, env) -> None:
    code, out, err = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body()),
                                          "TPUSERVE_QR_GENERATION": "gen-9"})
    assert code == 0, err
    assert out == (f"tpuserve: created {REF.name}: ACTIVE; ACTIVE can take a while: wait for it "
                   "with `tpuserve wait flex`\n")
    assert "tpuserve: queued resource tpuserve-flex: ACTIVE" in err
    [post] = fast_api.calls("POST")
    assert post.body == with_generation(body(), "gen-9")
    code, out, _ = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body()),
                                        "TPUSERVE_QR_GENERATION": "gen-9"})
    assert code == 0 and out.startswith("tpuserve: adopted")
    code, out, _ = run_cli(["describe"], env)
    assert code == 0 and json.loads(out)["state"]["state"] == "ACTIVE"
    assert run_cli(["delete"], env)[:2] == (0, f"tpuserve: deleted {REF.name}\n")
    assert run_cli(["delete"], env)[:2] == (0, f"tpuserve: already gone: {REF.name}\n")
    assert run_cli(["describe"], env)[0] == 1


def test_cli_body_file(fast_api, env, tmp_path) -> None:
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body()))
    assert run_cli(["create", "--body-file", str(path)], env)[0] == 0
    assert fast_api.calls("POST")[0].body == body()


@pytest.mark.parametrize(("argv", "extra", "message"), [
    (["create"], {}, "body is missing: set TPUSERVE_QR_BODY"),
    (["create"], {"TPUSERVE_QR_BODY": "{not json"}, "TPUSERVE_QR_BODY: not valid JSON"),
    (["create"], {"TPUSERVE_QR_BODY": "[]"}, "TPUSERVE_QR_BODY: must be a JSON object"),
    (["create"], {"TPUSERVE_QR_BODY": '{"tpu": {}}'}, "nodeSpec must be a non-empty list"),
    (["create", "--body-file", "/nonexistent/b.json"], {}, "No such file"),
    (["create"], {"TPUSERVE_QR_BODY": json.dumps(body()), "TPUSERVE_QR_GENERATION": "A B"},
     "label value"),
    (["delete"], {"TPUSERVE_QR_NAME": ""}, "name is missing"),
    (["delete", "--name", "tpuserve-flex"], {}, "must look like projects/"),
    (["delete"], {"TPUSERVE_QR_POLL_SECONDS": "soon"}, "TPUSERVE_QR_POLL_SECONDS = 'soon'"),
    (["probe"], {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": "localhost:1"},
     "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU = 'localhost:1': must be an API root URL"),
])
def test_cli_bad_input_is_one_line_exit_2(env, argv, extra, message) -> None:
    code, out, err = run_cli(argv, {**env, **extra})
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("tpuserve: ")


def test_cli_api_error_is_one_line_exit_1(fast_api, env) -> None:
    fast_api.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' "
                       "denied on 'projects/proj-test-1'", method="POST")
    code, _, err = run_cli(["create"], {**env, "TPUSERVE_QR_BODY": json.dumps(body())})
    assert code == 1 and "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "403" in ln]
    assert line.startswith(f"tpuserve: create queued resource {REF.name}: 403 PERMISSION_DENIED")
    assert "tpu.googleapis.com" in line


def test_cli_probe_speaks_the_external_data_source_protocol(fast_api, env) -> None:
    query = json.dumps({"name": REF.name})
    code, out, _ = run_cli(["probe"], env, query)
    missing = json.loads(out)
    assert code == 0 and missing["state"] == MISSING
    assert all(isinstance(v, str) for v in missing.values())  # the protocol: strings only
    fast_api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="gen-live")
    assert json.loads(run_cli(["probe"], env, query)[1]) == {"generation": "gen-live",
                                                             "state": "ACTIVE"}
    fast_api.set_state(QR_ID, "SUSPENDED")
    dead = json.loads(run_cli(["probe"], env, query)[1])
    assert dead["state"] == "SUSPENDED" and dead["generation"] != "gen-live"
    for bad in ("", "[]", '{"name": 3}', '{"name": "x"}'):
        code, out, err = run_cli(["probe"], env, bad or "nope")
        assert code == 2 and out == "" and err.startswith("tpuserve: probe")


def test_probe_of_a_live_qr_without_label_asks_for_a_new_one(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())  # made by hand: no label
    answer = probe(client, REF)
    assert answer["state"] == "ACTIVE"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", answer["generation"])  # a fresh token


# ---------------------------------------------------------------- zone rules (config)


def test_flex_zone_rules() -> None:
    raw = load_raw(environ={"TPUSERVE_ZONE": "europe-west4-a"})
    with pytest.raises(ConfigError) as err:
        from_raw(raw)
    [problem] = err.value.problems
    assert problem.startswith("[flex] gcp.zone = 'europe-west4-a': flex-start does not take")
    assert "FLEX_START provisioning model is not supported" in problem
    del raw["stacks"]["flex"]
    assert from_raw(raw).deployments["spot"].gcp.zone == "europe-west4-a"  # spot: no such rule
    known = from_raw(load_raw(environ={"TPUSERVE_ZONE": "us-central1-a"})).deployments["flex"]
    assert deployment_warnings(known) == []
    unknown = from_raw(load_raw(environ={"TPUSERVE_ZONE": "asia-east1-c"})).deployments["flex"]
    [warning] = deployment_warnings(unknown)
    assert warning.startswith("gcp.zone = 'asia-east1-c': flex-start acceptance")


def test_valid_until_duration_must_be_positive() -> None:
    raw = load_raw(environ={})
    raw["stacks"]["flex"]["valid_until_duration"] = "0s"
    with pytest.raises(ConfigError, match="valid_until_duration = '0s': must be more than 0"):
        from_raw(raw)


def test_progress_is_a_spinner_on_a_terminal_and_lines_elsewhere() -> None:
    from tpuserve.gcp.queued_resource import rich_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        with rich_progress("queued resource tpuserve-flex", stream) as progress:
            for state in ("ACCEPTED", "ACCEPTED", "ACTIVE"):
                progress(state, 1.0)
    assert pipe.getvalue().splitlines() == [
        "tpuserve: queued resource tpuserve-flex: ACCEPTED (1 s)",
        "tpuserve: queued resource tpuserve-flex: ACTIVE (1 s)",
    ]
    assert "\x1b[" in tty.getvalue()  # rich drew on the terminal
    assert tty.getvalue().count("queued resource tpuserve-flex: ACTIVE") >= 1
