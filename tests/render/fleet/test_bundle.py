"""The fleet bundle's invariants: one source of truth with the VM stacks, ports that agree,
one chip per pod, a digest-pinned image, the VM's compile-cache object, no secret value, and
config values emitted as data."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.render.fleet.conftest import DIGEST, IMAGE, fleet_deployment, fleet_raw
from tpuserve.render import fleet_bundle as fb
from tpuserve.render.boot_script import (
    CACHE_OBJECT_PREFIX,
    READY_TIMEOUT_S,
    VLLM_BACKEND_PORT,
    startup_context,
    vllm_command,
)
from tpuserve.render.vllm_args import CONTAINER_HF_TOKEN_PATH, container_env
from tpuserve.settings import ConfigError, from_raw


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod(objects):
    return one(objects, "Deployment", fb.DEPLOYMENT)["spec"]["template"]["spec"]


def container(objects, name: str) -> dict[str, Any]:
    spec = pod(objects)
    return next(c for c in spec["containers"] + spec["initContainers"] if c["name"] == name)


def vm_twin():
    """The `spot` VM stack with the same image and vLLM settings."""
    raw = fleet_raw()
    raw["stacks"]["spot"].setdefault("vllm", {})["image"] = IMAGE
    return from_raw(raw).deployments["spot"]


def test_every_object_is_a_mapping_with_kind_and_name(objects) -> None:
    assert objects[0]["kind"] == "Namespace"
    for o in objects:
        assert {"apiVersion", "kind", "metadata"} <= set(o)
        assert o["metadata"]["name"]
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names))


def test_the_bundle_text_round_trips(fleet, objects) -> None:
    text = fb.render_bundle(fleet)
    assert list(yaml.safe_load_all(text)) == objects
    assert fb.bundle_sha256(text) == fb.bundle_sha256(fb.render_bundle(fleet))


def test_vllm_runs_exactly_the_vm_argv_and_env(objects) -> None:
    vm = vm_twin()
    c = container(objects, "vllm")
    # The VM renders `vllm serve ... --host 127.0.0.1 --port 8001` with the proxy on: same here.
    assert c["args"] == vllm_command(vm)
    assert c["args"][-4:] == ["--host", "127.0.0.1", "--port", str(VLLM_BACKEND_PORT)]
    assert "command" not in c
    assert {e["name"]: e["value"] for e in c["env"]} == container_env(vm.vllm)
    assert all(set(e) == {"name", "value"} for e in c["env"])


def test_one_chip_per_pod_on_a_1x1_v5e(objects) -> None:
    spec = pod(objects)
    res = container(objects, "vllm")["resources"]
    assert res["requests"] == res["limits"] == {"google.com/tpu": 1}
    sel = spec["nodeSelector"]
    assert sel["cloud.google.com/compute-class"] == fb.COMPUTE_CLASS
    assert sel["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
    assert sel["cloud.google.com/gke-tpu-topology"] == "1x1"
    assert sel["node.kubernetes.io/instance-type"] == "ct5lp-hightpu-1t"
    for c in spec["containers"] + spec["initContainers"]:
        if c["name"] != "vllm":
            assert "google.com/tpu" not in str(c.get("resources"))


def test_rollout_never_needs_a_spare_chip_and_replicas_belong_to_the_hpa(objects) -> None:
    dep = one(objects, "Deployment", fb.DEPLOYMENT)
    assert "replicas" not in dep["spec"]
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert dep["spec"]["selector"]["matchLabels"] == fb.APP_LABEL
    # The pods carry the VM stacks' metric labels too (PodMonitoring copies them).
    assert dep["spec"]["template"]["metadata"]["labels"] == {
        **fb.APP_LABEL, "deployment": "tpuserve", "stack": "fleet", "provisioning_model": "fleet"}


def test_shm_and_probes(fleet, objects) -> None:
    spec = pod(objects)
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert fleet.vllm.shm_size == "10gb"
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "10Gi"}
    c = container(objects, "vllm")
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    sp = c["startupProbe"]
    assert sp["httpGet"] == {"path": "/health", "port": fb.PROXY_PORT}
    budget = sp["periodSeconds"] * sp["failureThreshold"]
    assert READY_TIMEOUT_S <= budget < READY_TIMEOUT_S + sp["periodSeconds"]
    assert budget > 2 * 857  # the measured cold boot, with margin
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": fb.PROXY_PORT}


def test_the_hf_token_is_the_vm_file_path_from_the_csi_mount(objects) -> None:
    c = container(objects, "vllm")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "hf-token")
    assert mount["readOnly"] is True
    assert mount["mountPath"] + "/hf_token" == CONTAINER_HF_TOKEN_PATH
    spc = one(objects, "SecretProviderClass", fb.SECRET_CLASSES["hf"])
    secrets = yaml.safe_load(spc["spec"]["parameters"]["secrets"])
    base = vm_twin().base
    name = f"projects/{base.project}/secrets/{base.hf_token_secret_id}/versions/latest"
    assert secrets == [{"resourceName": name, "path": "hf_token"}]
    key = yaml.safe_load(one(objects, "SecretProviderClass", fb.SECRET_CLASSES["key"])
                         ["spec"]["parameters"]["secrets"])
    assert key[0]["resourceName"].endswith(f"/secrets/{vm_twin().base.api_key_secret_id}"
                                           "/versions/latest")
    # The API key reaches only the step that writes the proxy's rule; vLLM never sees it.
    assert "api-key" not in [m["name"] for m in c["volumeMounts"]]


def test_no_secret_value_anywhere(objects) -> None:
    assert not [o for o in objects if o["kind"] == "Secret"]
    text = yaml.safe_dump_all(objects)
    for word in ("secretKeyRef", "envFrom", "HF_TOKEN:", "stringData"):
        assert word not in text
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            spec = o["spec"]["template"]["spec"]
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                assert "envFrom" not in c
                for e in c.get("env", []):
                    assert "secretKeyRef" not in str(e.get("valueFrom", ""))
                    assert e["name"] != "HF_TOKEN"


def test_ports_agree_everywhere(objects) -> None:
    p = fb.PROXY_PORT
    proxy = container(objects, "proxy")
    assert proxy["ports"] == [{"name": "http", "containerPort": p, "protocol": "TCP"}]
    svc = one(objects, "Service", fb.SERVICE)["spec"]
    assert svc["type"] == "ClusterIP" and svc["selector"] == fb.APP_LABEL
    assert svc["ports"][0]["port"] == svc["ports"][0]["targetPort"] == p
    hc = one(objects, "HealthCheckPolicy", fb.GATEWAY)["spec"]
    assert hc["default"]["config"]["httpHealthCheck"] == {"port": p, "requestPath": "/health"}
    pool = one(objects, "InferencePool", fb.INFERENCE_POOL)["spec"]
    assert pool["targetPorts"] == [{"number": p}]
    assert pool["selector"]["matchLabels"] == fb.APP_LABEL
    pm = one(objects, "PodMonitoring", fb.DEPLOYMENT)["spec"]
    assert pm["endpoints"] == [{"port": p, "path": "/metrics", "interval": "15s"}]
    np = one(objects, "NetworkPolicy", fb.DEPLOYMENT)["spec"]
    assert np["podSelector"]["matchLabels"] == fb.APP_LABEL
    assert np["ingress"][0]["ports"] == [{"protocol": "TCP", "port": p}]
    nginx = one(objects, "ConfigMap", fb.HELPER_CONFIGMAP)["data"]["nginx.conf"]
    assert f"listen {p};" in nginx and f"server 127.0.0.1:{VLLM_BACKEND_PORT};" in nginx
    assert "ssl" not in nginx.replace("ssl_", "")


def test_network_policy_sources(fleet, objects) -> None:
    frm = one(objects, "NetworkPolicy", fb.DEPLOYMENT)["spec"]["ingress"][0]["from"]
    cidrs = [f["ipBlock"]["cidr"] for f in frm if "ipBlock" in f]
    assert cidrs[0] == fleet.fleet.proxy_only_cidr
    assert {"podSelector": {"matchLabels": fb.EPP_LABEL}} in frm
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}
            } in frm
    nginx = one(objects, "ConfigMap", fb.HELPER_CONFIGMAP)["data"]["nginx.conf"]
    assert f"{fleet.fleet.pods_cidr} 1;" in nginx  # /metrics without the key: pods only


def test_the_cache_object_is_the_vms_for_the_same_settings_and_digest(fleet, objects) -> None:
    vm_key = startup_context(vm_twin())["cache_key"]
    vm_object = f"{CACHE_OBJECT_PREFIX}{vm_key}-{DIGEST[:12]}.tar.gz"  # cache_select's name
    assert fb.cache_object(fleet) == vm_object
    for name in ("xla-cache-restore", "xla-cache-publish"):
        env = {e["name"]: e["value"] for e in container(objects, name)["env"]}
        assert env["OBJECT"] == vm_object and env["BUCKET"] == fleet.base.cache_bucket
    restore = container(objects, "xla-cache-restore")
    assert pod(objects)["initContainers"].index(restore) >= 0
    vllm_cache = next(m for m in container(objects, "vllm")["volumeMounts"]
                      if m["name"] == "xla-cache")
    assert vllm_cache["mountPath"] == "/root/.cache/vllm"


def test_a_tag_only_image_is_refused() -> None:
    raw = fleet_raw()
    raw["stacks"]["fleet"]["vllm"]["image"] = "vllm/vllm-tpu:nightly"
    d = from_raw(raw).deployments["fleet"]
    with pytest.raises(ValueError, match=r"vllm\.image"):
        fb.render_objects(d)


def test_hpa_follows_the_config(fleet, objects) -> None:
    hpa = one(objects, "HorizontalPodAutoscaler", fb.HPA)["spec"]
    f = fleet.fleet
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (f.min_replicas, f.max_replicas)
    m = hpa["metrics"][0]
    metric = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
    assert m["pods"]["metric"]["name"] == metric
    assert m["pods"]["target"] == {"type": "AverageValue", "averageValue": str(f.queue_target)}
    assert hpa["behavior"]["scaleUp"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": f.scale_up_period_s}]
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == f.scale_down_window_s


def test_hpa_bounds_beyond_kubernetes_are_refused() -> None:
    # Kubernetes caps a policy's periodSeconds at 1800: the setting is refused before render.
    with pytest.raises(ConfigError, match=r"fleet\.scale_up_period_s"):
        fleet_deployment(scale_up_period_s=3600)


def test_compute_class_follows_provisioning_order() -> None:
    d = fleet_deployment(provisioning=["spot", "ondemand", "flex"])
    cc = one(fb.render_objects(d), "ComputeClass", fb.COMPUTE_CLASS)["spec"]
    assert cc["priorities"] == [{"nodepools": ["tpu-spot"]}, {"nodepools": ["tpu-ondemand"]},
                                {"nodepools": ["tpu-flex"]}]
    assert cc["nodePoolAutoCreation"] == {"enabled": False}


def test_gateway_http_by_default_https_with_a_domain(fleet, objects) -> None:
    gw = one(objects, "Gateway", fb.GATEWAY)["spec"]
    assert gw["gatewayClassName"] == "gke-l7-regional-external-managed"
    assert gw["addresses"] == [{"type": "NamedAddress",
                                "value": f"{fleet.base.deployment}-fleet-ip"}]
    assert [(lst["protocol"], lst["port"]) for lst in gw["listeners"]] == [("HTTP", 80)]
    d = fleet_deployment(domain="llm.example.com")
    objs = fb.render_objects(d)
    lst = one(objs, "Gateway", fb.GATEWAY)["spec"]["listeners"]
    assert [(x["protocol"], x["port"], x["hostname"]) for x in lst] == [
        ("HTTPS", 443, "llm.example.com")]
    assert lst[0]["tls"]["options"] == {
        "networking.gke.io/cert-manager-certs": f"{d.base.deployment}-fleet-cert"}
    assert one(objs, "HTTPRoute", fb.GATEWAY)["spec"]["hostnames"] == ["llm.example.com"]


def test_route_to_the_inference_pool_or_the_service_fallback(fleet, objects) -> None:
    ref = one(objects, "HTTPRoute", fb.GATEWAY)["spec"]["rules"][0]["backendRefs"]
    assert ref == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                    "name": fb.INFERENCE_POOL}]
    bp = one(objects, "GCPBackendPolicy", fb.GATEWAY)["spec"]
    assert bp["default"]["timeoutSec"] == 3600
    assert bp["targetRef"]["kind"] == "InferencePool"
    objs = fb.render_objects(fleet, backend="service")
    ref = one(objs, "HTTPRoute", fb.GATEWAY)["spec"]["rules"][0]["backendRefs"]
    assert ref == [{"group": "", "kind": "Service", "name": fb.SERVICE, "port": fb.PROXY_PORT}]
    assert not [o for o in objs if o["kind"] == "InferencePool"]
    assert one(objs, "HealthCheckPolicy", fb.GATEWAY)["spec"]["targetRef"]["kind"] == "Service"
    with pytest.raises(ValueError, match="backend"):
        fb.render_objects(fleet, backend="nope")


def test_stage_weights_job_and_restore_share_the_prefix(fleet, objects) -> None:
    job = fb.weights_job(objects)["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in job["containers"][0]["env"]}
    assert env["BUCKET"] == fleet.base.weights_bucket
    assert env["HF_TOKEN_PATH"] == CONTAINER_HF_TOKEN_PATH
    restore = {e["name"]: e["value"] for e in container(objects, "weights-restore")["env"]}
    assert restore["PREFIX"] == env["PREFIX"] == "hf/hub/models--google--gemma-4-E2B-it/"
    assert restore["DEST"] == "/dev/shm/hub/models--google--gemma-4-E2B-it"


def test_hostile_values_are_emitted_as_data(fleet) -> None:
    # The settings refuse these already; the renderer must not depend on that.
    evil = "org/name: x # not a comment\n- [y]: {z}"
    d = fleet.model_copy(update={"vllm": fleet.vllm.model_copy(update={"model": evil})})
    objs = fb.render_objects(d)
    c = container(objs, "vllm")
    assert c["args"][2] == evil
    assert c["args"] == vllm_command(d)
    job = fb.weights_job(objs)["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in job["env"]}["MODEL"] == evil
    assert len(objs) == len(fb.render_objects(fleet))
    assert list(yaml.safe_load_all(fb.render_bundle(d))) == objs


def test_a_changed_job_gets_a_new_name_an_unchanged_one_keeps_it(fleet) -> None:
    """A Job's pod template is immutable: the same name with a new template would fail the
    whole `kubectl apply`, so the name follows the spec."""
    first = fb.weights_job(fb.render_objects(fleet))
    assert fb.weights_job(fb.render_objects(fleet))["metadata"] == first["metadata"]
    other = IMAGE.split("@")[0] + "@sha256:" + "cd" * 32
    d = fleet.model_copy(update={"vllm": fleet.vllm.model_copy(update={"image": other})})
    objs = fb.render_objects(d)
    second = fb.weights_job(objs)
    assert second["spec"]["template"]["spec"]["containers"][0]["image"] == other
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert second["metadata"]["name"].startswith(fb.WEIGHTS_JOB + "-")
    # Everything mutable keeps its name: the Deployment rolls in place.
    assert [o["metadata"]["name"] for o in objs if o["kind"] != "Job"] == [
        o["metadata"]["name"] for o in fb.render_objects(fleet) if o["kind"] != "Job"]
    assert second["spec"]["ttlSecondsAfterFinished"] > 0
