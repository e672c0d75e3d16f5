"""The security context of every pod the fleet's templates render (the vendored adapter aside):
what `./dev scan` (.checkov-k8s.yaml) checks, held here without checkov."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.render import fleet_bundle as fb

from .conftest import fleet_deployment

VENDOR_NAMESPACE = "custom-metrics"   # the vendored custom-metrics adapter's own namespace


def our_pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f'{o["kind"]}/{o["metadata"]["name"]}': o["spec"]["template"]["spec"]
            for o in objects
            if o["kind"] in ("Deployment", "Job")
            and o["metadata"].get("namespace") != VENDOR_NAMESPACE}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("backend", fb.BACKENDS)
@pytest.mark.parametrize("cache", [True, False])
def test_every_pod_and_container_we_render_is_confined(backend, cache) -> None:
    d = fleet_deployment()
    d = d.model_copy(update={"cache": d.cache.model_copy(update={"enabled": cache})})
    objects = fb.render_objects(d, backend=backend)
    pods = our_pods(objects)
    job = fb.weights_job(objects)["metadata"]["name"]
    expected = {f"Deployment/{fb.DEPLOYMENT}", f"Job/{job}"}
    if backend == "inferencepool":
        expected.add(f"Deployment/{fb.EPP}")
    assert set(pods) == expected
    for name, spec in pods.items():
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in containers(spec):
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, (name, c["name"])
            assert not sc.get("privileged"), (name, c["name"])
            assert "NET_RAW" in sc["capabilities"]["drop"] or "ALL" in sc["capabilities"]["drop"]


def test_capabilities_drop_all_but_vllm_and_nginx_keep_only_what_they_need(objects) -> None:
    for name, spec in our_pods(objects).items():
        for c in containers(spec):
            caps = c["securityContext"]["capabilities"]
            if c["name"] == "vllm":   # TPU device access: the runtime's defaults but NET_RAW
                assert caps == {"drop": ["NET_RAW"]}
            elif c["name"] == "proxy":   # nginx: the master chowns, then switches user
                assert caps == {"drop": ["ALL"], "add": ["CHOWN", "SETGID", "SETUID"]}
            else:
                assert caps == {"drop": ["ALL"]}, (name, c["name"])


def test_only_the_endpoint_picker_mounts_a_service_account_token(objects) -> None:
    pods = our_pods(objects)
    assert "automountServiceAccountToken" not in pods[f"Deployment/{fb.EPP}"]
    job = fb.weights_job(objects)["metadata"]["name"]
    for name in (f"Deployment/{fb.DEPLOYMENT}", f"Job/{job}"):
        assert pods[name]["automountServiceAccountToken"] is False


def test_the_weights_restore_has_no_memory_limit(objects) -> None:
    # It writes the snapshot into the dshm tmpfs, whose pages count against its memory.
    spec = our_pods(objects)[f"Deployment/{fb.DEPLOYMENT}"]
    c = next(c for c in spec["initContainers"] if c["name"] == "weights-restore")
    assert "memory" not in c["resources"].get("limits", {})
