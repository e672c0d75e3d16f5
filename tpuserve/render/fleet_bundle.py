"""The fleet's Kubernetes objects, rendered from the config (templates/fleet/).

Interface (the fleet stack, the CLI and the review use these names; the renderer behind them
is built in templates/fleet/):
- `render_objects(d) -> list[dict]`: every object, in apply order;
- `render_bundle(d) -> str`: the objects as one multi-document YAML text (what `kubectl apply
  --server-side -f -` reads, and what the stack's `terraform_data.k8s_bundle` stores);
- `bundle_sha256(text) -> str`.

Every config value reaches the YAML through the `y` filter (JSON, a subset of YAML: always
data, never structure). The vLLM container runs exactly the VM stacks' argv (`vllm_command`
with the proxy on: vLLM on 127.0.0.1:VLLM_BACKEND_PORT, the key proxy in front) and
`container_env`, so the compile-cache key, and the cache object's name, are the VM's.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from typing import TYPE_CHECKING, Any

from tpuserve.contracts import (
    ADAPTER_DEPLOYMENT,
    EPP_DEPLOYMENT,
    FLEET_NAMESPACE,
    HEALTH_CHECK_RANGES,
    VLLM_DEPLOYMENT,
)
from tpuserve.facts import COLD_START_S
from tpuserve.kinds import POOL_MODELS
from tpuserve.paths import TEMPLATE_DIR
from tpuserve.render.boot_script import (
    CACHE_GET_MAX_S,
    CACHE_OBJECT_PREFIX,
    READY_TIMEOUT_S,
    VLLM_BACKEND_PORT,
    boot_helper_text,
)
from tpuserve.render.proxy_conf import NODE_LAYOUT, render_nginx_conf
from tpuserve.render.templates import environment
from tpuserve.render.vllm_args import (
    CONTAINER_CACHE_DIR,
    CONTAINER_HF_HOME,
    CONTAINER_HF_TOKEN_PATH,
    compile_cache_key,
    container_env,
    listen_argv,
    serve_argv,
)

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

# Names every consumer shares.
NAMESPACE = FLEET_NAMESPACE
DEPLOYMENT = VLLM_DEPLOYMENT  # the vLLM Deployment (its pods: label app=vllm)
SERVICE = "vllm"
HPA = "vllm"
KSA = "vllm"                 # the pods' Kubernetes service account (Workload Identity)
GATEWAY = "tpuserve"
APP_LABEL = {"app": "vllm"}
PROXY_PORT = 8080            # the API-key proxy sidecar: every path but /health needs the key
WEIGHTS_JOB = "stage-weights"

# More shared names (the stack's node pools and IAM bindings use them).
COMPUTE_CLASS = "tpuserve-v5e"
NODE_POOLS = {m: f"tpu-{m}" for m in POOL_MODELS}  # tpu-flex, tpu-spot, tpu-ondemand
SECRET_CLASSES = {"hf": "hf-token", "key": "api-key"}  # SecretProviderClass names
HELPER_CONFIGMAP = "tpuserve-fleet"
INFERENCE_POOL = "vllm"
EPP = EPP_DEPLOYMENT
EPP_LABEL = {"app": EPP}
EPP_PORT = 9002
# The picker's args: kubernetes-sigs/gateway-api-inference-extension v1.5.0 (commit df9f8909fe06),
# config/charts/inferencepool with its default values, rendered by epplib/templates/
# _deployment.yaml in its order (the pool flags, the chart's `flags: {v: 1}`, tracing off as
# `inferenceExtension.tracing.enabled: false` renders it). v1.6.0 builds no picker (cmd/epp is
# gone), so v1.5.0 is the last release whose chart and image go together.
EPP_CHART_FLAGS_V = "1"
# The adapter's Deployment in the vendored manifest, whose image the setting replaces.
UPSTREAM_FLAGS = TEMPLATE_DIR / "fleet" / "vendor" / "upstream_flags.json"
METRIC_QUEUE = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
GATEWAY_CLASS = "gke-l7-regional-external-managed"
BACKENDS = ("inferencepool", "service")
# Kubernetes' own bounds on HPA behavior fields.
HPA_MAX_PERIOD_S = 1800
HPA_MAX_WINDOW_S = 3600
# The startupProbe: vLLM counts as failed after READY_TIMEOUT_S (~2.8x the measured cold boot,
# as on a VM), in PROBE_PERIOD_S steps.
PROBE_PERIOD_S = 10
# The weights restore gives up after this long (the 9.54 GiB checkpoint downloads from Hugging
# Face in ~10 s, SPEC 4; a restore slower than a cold compile's share is not worth waiting for).
WEIGHTS_GET_MAX_S = int(COLD_START_S) // 3
VENDOR_ADAPTER = TEMPLATE_DIR / "fleet" / "vendor" / "custom-metrics-stackdriver-adapter.yaml"
FLEET_HELPER = TEMPLATE_DIR / "fleet" / "fleet_helper.py"
TEMPLATES = (
    "fleet/identity.yaml.j2",
    "fleet/computeclass.yaml.j2",
    "fleet/stage-weights.yaml.j2",
    "fleet/vllm.yaml.j2",
    "fleet/service.yaml.j2",
    "fleet/epp.yaml.j2",
    "fleet/gateway.yaml.j2",
)
_DIGEST = re.compile(r"@sha256:([0-9a-f]{64})$")


def _y(value: Any) -> str:
    """Any value as a YAML flow node (JSON): data, whatever characters it holds."""
    return json.dumps(value, ensure_ascii=True)


_env = environment(y=_y)


def image_digest(image: str) -> str:
    m = _DIGEST.search(image)
    if not m:
        raise ValueError(
            f"vllm.image = {image[:120]!r}: the fleet needs a digest-pinned image "
            "(repo[:tag]@sha256:<64 hex>): every replica must run the same build, and the "
            "compile cache's object name holds 12 hex of that digest"
        )
    return m.group(1)


def vllm_argv(d: Deployment) -> list[str]:
    """What `boot_script.vllm_command` renders with the API-key proxy on."""
    return serve_argv(d.vllm) + listen_argv("127.0.0.1", VLLM_BACKEND_PORT)


def cache_object(d: Deployment) -> str:
    """The compile cache's object in the base's cache bucket: the VM stacks' name for the same
    settings and image digest (boot_script: cache_select)."""
    key = compile_cache_key(d, vllm_argv(d))
    return f"{CACHE_OBJECT_PREFIX}{key}-{image_digest(d.vllm.image)[:12]}.tar.gz"


def weights_prefix(d: Deployment) -> str:
    """Where the staged snapshot lives in the weights bucket: Hugging Face's own cache layout
    (hub/models--ORG--NAME/), so a restore into HF_HOME is found by vLLM as a cached download."""
    return "hf/" + _hf_repo_dir(d) + "/"


def _hf_repo_dir(d: Deployment) -> str:
    return "hub/models--" + d.vllm.model.replace("/", "--")


def k8s_quantity(docker_size: str) -> str:
    """docker's --shm-size (binary units: 10gb = 10 GiB) as a Kubernetes quantity."""
    m = re.fullmatch(r"([0-9]+)([kmg])b?", docker_size)
    if not m:
        raise ValueError(f"vllm.shm_size = {docker_size!r}: not a size like 10gb")
    return m.group(1) + {"k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2)]


def epp_args() -> list[str]:
    """The chart's args at v1.5.0 for a one-replica vLLM pool (no flag of its own here)."""
    return ["--pool-name", INFERENCE_POOL, "--pool-namespace", NAMESPACE,
            "--pool-group", "inference.networking.k8s.io",
            "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml",
            "--v", EPP_CHART_FLAGS_V, "--tracing=false"]


def upstream_flags() -> dict[str, Any]:
    """vendor/upstream_flags.json: the flags the picker and the adapter accept at their pinned
    source (tools/extract_flags.py)."""
    return json.loads(UPSTREAM_FLAGS.read_text())


def flag_names(argv: list[str], bool_flags: Any) -> list[str]:
    """The flag names an argv sets (`--x v`, `--x=v`, a bare boolean `--x`)."""
    names, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            raise ValueError(f"argument {arg!r} is no flag's value")
        name, eq, _ = arg.lstrip("-").partition("=")
        names.append(name)
        i += 1 if eq or name in bool_flags else 2
    return names


def check_flags(program: str, argv: list[str]) -> None:
    """Refuse (one line) an argv with a flag the program's source at its pinned tag does not
    define, marks deprecated, or refuses when set: the program would stop at start-up."""
    data = upstream_flags()[program]
    src = data["sources"][0]
    where = f"{src['repository']} {src['ref']} ({src['commit'][:12]})"
    for name in flag_names(argv, set(data["bool_flags"])):
        if name not in data["flags"]:
            raise ValueError(f"{program}: --{name} is not a flag of {data['program']} at {where}"
                             " (templates/fleet/vendor/upstream_flags.json)")
        if name in data["refused_when_set"] or name in data["deprecated"]:
            why = data["deprecated"].get(name, "refused when set")
            raise ValueError(f"{program}: --{name} is deprecated at {where}: {why}")


def _adapter(d: Deployment) -> list[dict[str, Any]]:
    """The vendored adapter, its image the setting's (its upstream tag with the digest)."""
    import yaml

    docs = [o for o in yaml.safe_load_all(VENDOR_ADAPTER.read_text()) if o is not None]
    [deploy] = [o for o in docs if o["kind"] == "Deployment"
                and o["metadata"]["name"] == ADAPTER_DEPLOYMENT]
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    if container["image"] != d.fleet.adapter_image.split("@", 1)[0]:
        raise ValueError(f"fleet.adapter_image = {d.fleet.adapter_image!r}: the vendored "
                         f"manifest runs {container['image']}")
    container["image"] = d.fleet.adapter_image
    container["imagePullPolicy"] = "IfNotPresent"  # a digest never changes: no re-pull
    check_flags("adapter", container["command"][1:])
    return docs


def _check_hpa(d: Deployment) -> None:
    f = d.fleet
    if f.scale_up_period_s > HPA_MAX_PERIOD_S:
        raise ValueError(f"fleet.scale_up_period_s = {f.scale_up_period_s}: Kubernetes caps an "
                         f"HPA policy's periodSeconds at {HPA_MAX_PERIOD_S}")
    if f.scale_down_window_s > HPA_MAX_WINDOW_S:
        raise ValueError(f"fleet.scale_down_window_s = {f.scale_down_window_s}: Kubernetes caps "
                         f"stabilizationWindowSeconds at {HPA_MAX_WINDOW_S}")


def context(d: Deployment, *, backend: str = "inferencepool") -> dict[str, Any]:
    if backend not in BACKENDS:
        raise ValueError(f"backend = {backend!r}: one of {', '.join(BACKENDS)}")
    _check_hpa(d)
    digest = image_digest(d.vllm.image)
    argv = vllm_argv(d)
    base = d.base
    token_dir, token_file = posixpath.split(CONTAINER_HF_TOKEN_PATH)
    nginx_conf = render_nginx_conf(
        public_port=PROXY_PORT, backend_port=VLLM_BACKEND_PORT, tls=False,
        metrics_allow=(d.fleet.pods_cidr,),
    )
    helper = FLEET_HELPER.read_text()
    boot_helper = boot_helper_text()
    files_sha = hashlib.sha256(
        json.dumps([nginx_conf, helper, boot_helper]).encode()).hexdigest()[:16]
    accel = d.tpu.accelerator
    secret = "projects/{}/secrets/{}/versions/latest".format
    return {
        "ns": NAMESPACE, "deployment": DEPLOYMENT, "service": SERVICE, "hpa": HPA, "ksa": KSA,
        "gateway": GATEWAY, "app_label": APP_LABEL, "proxy_port": PROXY_PORT,
        "pod_labels": {**APP_LABEL, **metric_labels(d)},
        "metric_pod_labels": [{"from": k} for k in metric_labels(d)],
        "weights_job": WEIGHTS_JOB, "compute_class": COMPUTE_CLASS,
        "node_pools": [NODE_POOLS[m] for m in d.fleet.provisioning],
        # The configured slice (tpuserve/accelerators.py): one replica per node, all its chips.
        "machine_type": accel.machine_type, "tpu_accelerator": accel.family.gke_accelerator,
        "tpu_topology": accel.topology, "tpu_chips": accel.chips,
        "spc_hf": SECRET_CLASSES["hf"], "spc_key": SECRET_CLASSES["key"],
        # The provider's `secrets` parameter is itself YAML text: built here, as JSON.
        "spc_hf_secrets": json.dumps([{"resourceName": secret(base.project,
                                                              base.hf_token_secret_id),
                                       "path": token_file}]),
        "spc_key_secrets": json.dumps([{"resourceName": secret(base.project,
                                                               base.api_key_secret_id),
                                        "path": "api-key"}]),
        "helper_configmap": HELPER_CONFIGMAP,
        "nginx_conf": nginx_conf, "fleet_helper": helper, "boot_helper": boot_helper,
        "files_sha": files_sha,
        "image": d.vllm.image, "image_digest12": digest[:12],
        "proxy_image": d.access.proxy_image,
        "vllm_args": argv,
        "vllm_env": [{"name": k, "value": v} for k, v in container_env(d.vllm).items()],
        "hf_home": CONTAINER_HF_HOME, "token_dir": token_dir,
        "token_path": CONTAINER_HF_TOKEN_PATH,
        "cache_dir": CONTAINER_CACHE_DIR,
        "shm_size": k8s_quantity(d.vllm.shm_size),
        "backend_port": VLLM_BACKEND_PORT,
        "probe_period_s": PROBE_PERIOD_S,
        "startup_failures": math.ceil(READY_TIMEOUT_S / PROBE_PERIOD_S),
        "cache_enabled": d.cache.enabled,
        "cache_bucket": base.cache_bucket, "cache_object": cache_object(d),
        "cache_get_max_s": CACHE_GET_MAX_S,
        "weights_bucket": base.weights_bucket, "weights_prefix": weights_prefix(d),
        "weights_dest": posixpath.join(CONTAINER_HF_HOME, _hf_repo_dir(d)),
        "weights_get_max_s": WEIGHTS_GET_MAX_S,
        "model": d.vllm.model,
        "fleet": d.fleet,
        "queue_target": str(d.fleet.queue_target),
        "metric_queue": METRIC_QUEUE,
        "inference_pool": INFERENCE_POOL, "epp": EPP, "epp_label": EPP_LABEL,
        "epp_port": EPP_PORT, "epp_image": d.fleet.picker_image, "epp_args": epp_args(),
        "backend": backend,
        "gateway_class": GATEWAY_CLASS,
        "address": f"{base.deployment}-fleet-ip",
        "certificate": f"{base.deployment}-fleet-cert",
        "domain": d.fleet.domain,
        "collector_sources": [d.fleet.proxy_only_cidr, *HEALTH_CHECK_RANGES],
        "key_include": NODE_LAYOUT.key_include,
        "labels": base.labels,
    }


def metric_labels(d: Deployment) -> dict[str, str]:
    """The labels every vLLM series carries on the VM stacks too (render/collector_conf.py)."""
    return {"deployment": d.gcp.deployment, "stack": d.name,
            "provisioning_model": d.stack.provisioning_model}


def render_objects(d: Deployment, *, backend: str = "inferencepool") -> list[dict[str, Any]]:
    """Every object in apply order. `backend="service"`: the documented fallback, the Gateway's
    HTTPRoute to the plain Service (no InferencePool, no endpoint picker)."""
    import yaml

    ctx = context(d, backend=backend)
    objects: list[dict[str, Any]] = []
    for name in TEMPLATES:
        text = _env.get_template(name).render(**ctx)
        objects += [o for o in yaml.safe_load_all(text) if o is not None]
    check_flags("picker", epp_args())
    adapter = _adapter(d)
    for obj in objects:
        if obj["kind"] == "Job":
            _name_for_its_spec(obj)
    return objects[:1] + adapter + objects[1:]


def _name_for_its_spec(job: dict[str, Any]) -> None:
    """A Job's pod template is immutable: re-applying a changed one under the same name fails
    the whole apply. Named `<name>-<hash of its spec>`, a change (say a new image digest)
    creates a new Job; the unchanged one re-applies as a no-op."""
    digest = hashlib.sha256(json.dumps(job["spec"], sort_keys=True).encode()).hexdigest()
    job["metadata"]["name"] = f"{job['metadata']['name']}-{digest[:10]}"


def weights_job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The rendered weights-staging Job (its name carries its spec's hash)."""
    found = [o for o in objects if o["kind"] == "Job"
             and o["metadata"]["name"].startswith(WEIGHTS_JOB + "-")]
    if len(found) != 1:
        raise LookupError(f"{len(found)} {WEIGHTS_JOB} Jobs rendered")
    return found[0]


def render_bundle(d: Deployment, *, backend: str = "inferencepool") -> str:
    import yaml

    return yaml.safe_dump_all(render_objects(d, backend=backend), sort_keys=False)


def bundle_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
