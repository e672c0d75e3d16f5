"""Fidelity of the fake Kubernetes API: the official client reads its answers into its own models
(the shapes are the API's), its objects pass the Kubernetes JSON schemas, and it refuses what
the real API server refuses (no token, RBAC, unknown paths and parameters, unindexed fields)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
from kubernetes import client, config

from tests.fakes import kubernetes as fk

NS = "tpuserve"
LABELS = {"app": "vllm"}
K8S_VERSION = "1.33"  # GKE REGULAR channel's minor at the time of writing


@pytest.fixture
def fake() -> Iterator[fk.FakeKubernetes]:
    with fk.FakeKubernetes() as server:
        server.put(fk.deployment(NS, "vllm", desired=2, ready=1, labels=LABELS))
        server.put(fk.hpa(NS, "vllm", target="8", metric="vllm:num_requests_waiting",
                          current="3500m", current_replicas=2, desired_replicas=2,
                          min_replicas=1, max_replicas=4))
        server.put(fk.gateway(NS, "tpuserve", address="34.1.2.3"))
        server.put(fk.pod(NS, "vllm-a-00001", LABELS, state="ready"))
        server.put(fk.pod(NS, "vllm-a-00002", LABELS, state="unschedulable",
                          message="0/3 nodes are available: 3 Insufficient google.com/tpu."))
        server.put(fk.pod(NS, "other-00003", {"app": "other"}, state="ready"))
        server.put(fk.event(NS, "vllm-a-00002", reason="FailedScaleUp",
                            message="Node scale up in zones us-west4-a associated with this "
                            "pod failed: GCE out of resources."))
        server.put(fk.event(NS, "vllm-a-00001", reason="Started", message="Started container",
                            type_="Normal", component="kubelet"))
        yield server


@pytest.fixture
def api(fake: fk.FakeKubernetes, tmp_path: Path) -> client.ApiClient:
    path = tmp_path / "kubeconfig"
    path.write_text(fake.kubeconfig("ctx"))
    return config.new_client_from_config(config_file=str(path), context="ctx",
                                         persist_config=False)


def test_the_official_client_reads_every_answer_into_its_models(api: client.ApiClient) -> None:
    dep = client.AppsV1Api(api).read_namespaced_deployment("vllm", NS)
    assert isinstance(dep, client.V1Deployment)
    assert (dep.spec.replicas, dep.status.ready_replicas) == (2, 1)
    hpa = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler("vllm", NS)
    assert hpa.spec.metrics[0].pods.target.average_value == "8"
    assert hpa.status.current_metrics[0].pods.current.average_value == "3500m"
    pods = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="app=vllm")
    assert sorted(p.metadata.name for p in pods.items) == ["vllm-a-00001", "vllm-a-00002"]
    pending = next(p for p in pods.items if p.status.phase == "Pending")
    assert pending.status.conditions[0].reason == "Unschedulable"
    events = client.CoreV1Api(api).list_namespaced_event(
        NS, field_selector="involvedObject.kind=Pod,involvedObject.name=vllm-a-00002")
    assert [e.reason for e in events.items] == ["FailedScaleUp"]
    gw = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", NS, "gateways", "tpuserve")
    assert gw["status"]["addresses"][0]["value"] == "34.1.2.3"


def test_the_objects_pass_the_kubernetes_schemas(fake: fk.FakeKubernetes) -> None:
    for obj in fake.objects.values():
        if obj["kind"] == "Gateway":  # a CRD: not in kubernetes-validate's core schemas
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_lists_page_with_limit_and_continue(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    first = core.list_namespaced_pod(NS, label_selector="app=vllm", limit=1)
    assert len(first.items) == 1 and first.metadata._continue
    rest = core.list_namespaced_pod(NS, label_selector="app=vllm", limit=1,
                                    _continue=first.metadata._continue)
    assert len(rest.items) == 1 and not rest.metadata._continue
    assert first.items[0].metadata.name != rest.items[0].metadata.name


def _get(fake: fk.FakeKubernetes, path: str, token: str | None = "default") -> httpx.Response:
    headers = {} if token is None else {
        "Authorization": f"Bearer {fake.token if token == 'default' else token}"}
    return httpx.get(fake.url + path, headers=headers, timeout=5)


def test_refuses_what_the_api_server_refuses(fake: fk.FakeKubernetes) -> None:
    dep = f"/apis/apps/v1/namespaces/{NS}/deployments/vllm"
    no_token = _get(fake, dep, token=None)
    assert no_token.status_code == 401 and no_token.json()["reason"] == "Unauthorized"
    assert _get(fake, dep, token="wrong").status_code == 401
    assert _get(fake, dep).status_code == 200
    # Unknown paths: the bare 404 page; a missing object: a NotFound Status.
    unknown = _get(fake, f"/apis/apps/v1beta1/namespaces/{NS}/deployments/vllm")
    assert unknown.status_code == 404 and unknown.text == "404 page not found\n"
    missing = _get(fake, f"/apis/apps/v1/namespaces/{NS}/deployments/nope")
    assert missing.status_code == 404
    assert missing.json()["message"] == 'deployments.apps "nope" not found'
    # Parameters the client must not send.
    assert _get(fake, dep + "?pretty=true").status_code == 400
    assert _get(fake, f"/api/v1/namespaces/{NS}/pods?watch=1").status_code == 400
    assert _get(fake, f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dvllm"
                f"&labelSelector=x%3Dy").status_code == 400
    bad_field = _get(fake, f"/api/v1/namespaces/{NS}/events?fieldSelector=spec.x%3Dy")
    assert bad_field.status_code == 400 and "not a known field selector" in bad_field.text
    # RBAC.
    fake.forbidden = True
    denied = _get(fake, dep)
    assert denied.status_code == 403
    assert json.loads(denied.text)["message"].startswith('deployments.apps is forbidden: User')


def test_records_every_request(fake: fk.FakeKubernetes) -> None:
    _get(fake, f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dvllm&limit=5")
    assert fake.requests[-1] == ("GET", f"/api/v1/namespaces/{NS}/pods",
                                 "labelSelector=app%3Dvllm&limit=5")
