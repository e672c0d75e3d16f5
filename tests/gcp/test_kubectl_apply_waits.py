"""The fleet's apply waits, bounded, for what the Gateway cannot serve without: the CRDs GKE
installs with its add-ons Established before any object of their kinds is applied, the
endpoint picker and the adapter available, the Gateway Programmed; past the bound the step
fails in one line naming what is still missing.

The fake `gcloud` (tests/fakes/kubectl/) writes a kubeconfig that reaches the fake Kubernetes
API (tests/fakes/kubernetes.py); the fake `kubectl` records what is applied.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes import kubernetes as k8s
from tests.render.fleet.conftest import fleet_deployment
from tpuserve.gcp import kubectl
from tpuserve.gcp.kube_bundle import CRD_OF_KIND
from tpuserve.paths import REPO_ROOT
from tpuserve.render import fleet_bundle as fb

FAKES = REPO_ROOT / "tests" / "fakes" / "kubectl"
ADAPTER = ("custom-metrics", fb.ADAPTER_DEPLOYMENT)
# The bound the failing cases run to: room for the fake tools (each a Python process) to start
# on a loaded machine before the waits use up the rest.
BOUND_S = 5.0


@pytest.fixture(scope="module")
def bundle() -> str:
    return fb.render_bundle(fleet_deployment())


@pytest.fixture
def api() -> Iterator[k8s.FakeKubernetes]:
    with k8s.FakeKubernetes() as server:
        yield server


@pytest.fixture
def log(tmp_path: Path) -> Path:
    out = tmp_path / "kube-log"
    out.mkdir()
    return out


@pytest.fixture
def cluster(api: k8s.FakeKubernetes, log: Path, tmp_path: Path) -> kubectl.Cluster:
    env = {**os.environ, "PATH": f"{FAKES}{os.pathsep}{os.environ['PATH']}",
           "HOME": str(tmp_path), "FAKE_KUBE_PYTHON": sys.executable, "FAKE_KUBE_LOG": str(log),
           "FAKE_KUBECONFIG_TEXT": api.kubeconfig("gke_p_z_c")}
    return kubectl.Cluster("p", "z", "c", env)


def applied(log: Path) -> list[list[str]]:
    """The kinds of each `kubectl apply`, in order."""
    calls = [json.loads(line) for line in (log / "calls.jsonl").read_text().splitlines()]
    return [[o["kind"] for o in yaml.safe_load_all(c["stdin"]) if o]
            for c in calls if c["tool"] == "kubectl" and c["argv"][0] == "apply"]


def all_crds(api: k8s.FakeKubernetes, *, but: str = "") -> None:
    for name in CRD_OF_KIND.values():
        api.put(k8s.crd(name, established=name != but))


def ready(api: k8s.FakeKubernetes, *, picker: int = 1, programmed: bool = True) -> None:
    api.put(k8s.deployment(fb.NAMESPACE, fb.EPP, desired=1, ready=picker, labels=fb.EPP_LABEL))
    api.put(k8s.deployment(*ADAPTER, desired=1, ready=1, labels={"run": "adapter"}))
    api.put(k8s.gateway(fb.NAMESPACE, fb.GATEWAY, address="203.0.113.7" if programmed else None))


def run(cluster: kubectl.Cluster, bundle: str, **kw: Any) -> int:
    return kubectl.apply(cluster, bundle, **kw)


def test_everything_ready_applies_builtins_then_the_custom_kinds(api, cluster, bundle, log,
                                                                 capsys) -> None:
    all_crds(api)
    ready(api)
    run(cluster, bundle)
    first, second = applied(log)
    custom = {k for (_, k) in CRD_OF_KIND}
    assert not custom & set(first) and "Deployment" in first
    assert set(second) <= custom and "InferencePool" in second and "Gateway" in second
    paths = [p for _m, p, _q in api.requests]
    for name in CRD_OF_KIND.values():
        assert f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}" in paths
    assert f"/apis/apps/v1/namespaces/{fb.NAMESPACE}/deployments/{fb.EPP}" in paths
    gw = f"/apis/gateway.networking.k8s.io/v1/namespaces/{fb.NAMESPACE}/gateways/{fb.GATEWAY}"
    assert gw in paths
    # kubectl's own lines pass through; the count is the entry point's to print.
    assert capsys.readouterr().out.strip().endswith("serverside-applied")


def test_no_object_of_a_kind_is_applied_before_its_crd_is_established(api, cluster, bundle,
                                                                      log) -> None:
    all_crds(api, but="inferencepools.inference.networking.k8s.io")
    ready(api)
    with pytest.raises(kubectl.KubectlError) as exc:
        run(cluster, bundle, bound_s=BOUND_S, poll_s=0.25)
    line = str(exc.value)
    assert "\n" not in line
    assert line.startswith("k8s_bundle: after 15 min waiting for the CRDs GKE installs")
    assert "CRD inferencepools.inference.networking.k8s.io not Established (Installing)" in line
    assert "the next `cdktf deploy fleet` applies again" in line
    assert len(applied(log)) == 1  # the built-in kinds only: no InferencePool, no Gateway


def test_an_absent_crd_is_named(api, cluster, bundle) -> None:
    ready(api)
    with pytest.raises(kubectl.KubectlError,
                       match=r"CRD computeclasses\.cloud\.google\.com absent"):
        run(cluster, bundle, bound_s=BOUND_S, poll_s=0.25)


def test_a_picker_that_never_becomes_available_fails_the_step(api, cluster, bundle, log) -> None:
    all_crds(api)
    ready(api, picker=0)
    with pytest.raises(kubectl.KubectlError) as exc:
        run(cluster, bundle, bound_s=BOUND_S, poll_s=0.25)
    assert f"deployment {fb.NAMESPACE}/{fb.EPP} 0/1 available" in str(exc.value)
    assert "custom-metrics/" not in str(exc.value)  # the adapter is available
    assert len(applied(log)) == 2


def test_a_gateway_not_programmed_fails_the_step(api, cluster, bundle) -> None:
    all_crds(api)
    ready(api, programmed=False)
    with pytest.raises(kubectl.KubectlError,
                       match=f"gateway {fb.NAMESPACE}/{fb.GATEWAY} not Programmed "
                             r"\(False, Pending\)"):
        run(cluster, bundle, bound_s=BOUND_S, poll_s=0.25)


def test_the_state_that_becomes_ready_within_the_bound_passes(api, cluster, bundle) -> None:
    all_crds(api)
    ready(api, picker=0)
    polls = []

    def sleep(_s: float) -> None:  # the picker becomes available on the second poll
        polls.append(_s)
        ready(api)

    kubectl.apply(cluster, bundle, sleep=sleep, poll_s=0.01)
    assert polls


def test_an_unknown_custom_kind_is_refused_before_any_call(cluster, log) -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(kubectl.KubectlError, match="a Widget"):
        run(cluster, yaml.safe_dump(doc))
    assert not (log / "calls.jsonl").exists()


def test_the_fake_refuses_what_the_api_refuses(api) -> None:
    import urllib.error
    import urllib.request

    def get(path: str, token: str = api.token) -> int:
        req = urllib.request.Request(api.url + path, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
    assert get(base + "gateways.gateway.networking.k8s.io") == 404
    api.put(k8s.crd("gateways.gateway.networking.k8s.io"))
    assert get(base + "gateways.gateway.networking.k8s.io") == 200
    assert get(base + "gateways.gateway.networking.k8s.io?watch=1") == 400
    assert get(base + "gateways.gateway.networking.k8s.io", token="x") == 401


def test_no_call_starts_once_the_bound_has_passed(cluster, bundle, log) -> None:
    with pytest.raises(kubectl.KubectlError, match="bound passed before its next call"):
        run(cluster, bundle, bound_s=0)
    assert not (log / "calls.jsonl").exists()


def test_a_kubectl_that_does_not_answer_is_cut_at_the_bound(api, cluster, bundle) -> None:
    cluster.environ = {**cluster.environ, "FAKE_KUBECTL_SLEEP_S": "60"}
    with pytest.raises(kubectl.KubectlError, match="kubectl apply: no answer within the "
                       "apply's bound"):
        run(cluster, bundle, bound_s=3)
