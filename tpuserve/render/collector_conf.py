"""The node's metrics collector config (templates/collector.yaml.j2): config in, text out, no I/O.

A pinned OpenTelemetry Collector (contrib) container, started by the boot script beside vLLM,
scrapes vLLM's Prometheus /metrics on loopback and writes them to Google Managed Prometheus
(the `googlemanagedprometheus` exporter, credentials from the metadata server: the node's
service account needs roles/monitoring.metricWriter). It needs no API key (vLLM's own port is
loopback-only behind the proxy) and opens no port: no health_check, zpages or pprof extension,
and its own telemetry metrics are off (`level: none`, so no :8888 listener).

Every series carries the labels of `metric_labels` (stack, provisioning_model, deployment,
node, project, zone), so one dashboard and one set of alerts serve every stack; the GMP
resource (`prometheus_target`) is location=zone, cluster=deployment, namespace=stack,
instance=node.

Values are emitted as JSON strings (valid YAML double-quoted scalars) with `$` doubled: the
collector expands `${...}` in its config, and `$$` is its literal `$`.
"""

from __future__ import annotations

import json

from tpuserve.render.templates import environment
from tpuserve.settings import Deployment

# The image and the on/off switch are settings: monitoring.collector_image (default 0.160.0, a
# release of the contrib distribution that ships the googlemanagedprometheus exporter, the
# prometheus receiver and the resource/attributes processors; UNVERIFIED: the tag on Docker Hub
# and its digest, and `otelcol-contrib validate --config` against a rendered config) and
# monitoring.metrics.

COLLECTOR_CONTAINER_NAME = "tpuserve-metrics"
# The contrib image's own config path (its default CMD reads it); mounted read-only.
COLLECTOR_CONFIG_PATH = "/etc/otelcol-contrib/config.yaml"
SCRAPE_JOB = "vllm"
SCRAPE_INTERVAL_S = 15  # the Ops Agent's floor is 10 s; GMP's PodMonitoring examples use 15 s
SCRAPE_TIMEOUT_S = 10
METRICS_PATH = "/metrics"
# The collector's memory: a guard beside vLLM, which needs the host's RAM (HF_HOME in /dev/shm).
MEMORY_LIMIT_MIB = 256
CONTAINER_MEMORY = "512m"


def yaml_scalar(value: object) -> str:
    """VALUE as one YAML double-quoted scalar (JSON string syntax), `$` escaped for the
    collector's own ${...} expansion."""
    return json.dumps(str(value)).replace("$", "$$")


_env = environment(y=yaml_scalar)


def metric_labels(d: Deployment) -> dict[str, str]:
    """The labels added to every series: which stack, node and project a value came from."""
    return {
        "stack": d.name,
        "provisioning_model": d.stack.provisioning_model,
        "deployment": d.gcp.deployment,
        "node": d.node_name,
        "project": d.gcp.project,
        "zone": d.gcp.zone,
    }


def gmp_resource(d: Deployment) -> dict[str, str]:
    """The prometheus_target resource's attributes, set from config (no detection: whether the
    gcp resource detector recognises a TPU VM is unverified)."""
    return {
        "location": d.gcp.zone,
        "cluster": d.gcp.deployment,
        "namespace": d.name,
        "service.instance.id": d.node_name,
    }


def render_collector_conf(d: Deployment, *, backend_port: int) -> str:
    """The collector's config: scrape 127.0.0.1:`backend_port`/metrics (where vLLM listens:
    8001 behind the proxy, its public port without one; loopback either way)."""
    text = _env.get_template("collector.yaml.j2").render(
        job=SCRAPE_JOB,
        interval=f"{SCRAPE_INTERVAL_S}s",
        timeout=f"{SCRAPE_TIMEOUT_S}s",
        metrics_path=METRICS_PATH,
        target=f"127.0.0.1:{int(backend_port)}",
        resource=gmp_resource(d),
        labels=metric_labels(d),
        project=d.gcp.project,
        memory_limit_mib=MEMORY_LIMIT_MIB,
    )
    return text if text.endswith("\n") else text + "\n"
