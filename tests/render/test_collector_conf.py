"""The metrics collector's config (tpuserve/render/collector_conf.py) as text and as YAML: it
scrapes vLLM on loopback only, labels every series, exports to Managed Prometheus, listens on
nothing and holds no secret; the boot script carries it verbatim, or nothing when it is off."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuserve.render.boot_script import render_startup, startup_context
from tpuserve.render.collector_conf import (
    metric_labels,
    render_collector_conf,
)
from tpuserve.settings import ConfigError, Deployment, from_raw, load_raw

LABELS = ("stack", "provisioning_model", "deployment", "node", "project", "zone")


def _with(d: Deployment, **sections: dict[str, object]) -> Deployment:
    return d.model_copy(update={
        name: getattr(d, name).model_copy(update=values) for name, values in sections.items()
    })


def _conf(d: Deployment) -> dict[str, Any]:
    """The config the boot script would write for D, parsed."""
    return yaml.safe_load(startup_context(d)["collector_conf"])


def _walk(node: object) -> list[tuple[str, object]]:
    """Every (key, value) pair in a parsed YAML tree."""
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in [(str(k), v), *_walk(v)]]
    if isinstance(node, list):
        return [pair for v in node for pair in _walk(v)]
    return []


@pytest.fixture
def serving(deployments: dict[str, Deployment]) -> dict[str, Deployment]:
    """The stacks that boot a VM (the fleet runs on GKE)."""
    return {name: d for name, d in deployments.items() if not d.kind.on_gke}


def test_it_scrapes_only_vllm_on_loopback_every_15_s(serving: dict[str, Deployment]) -> None:
    for name, d in serving.items():
        for proxy, port in ((True, 8001), (False, d.vllm.port)):
            conf = _conf(_with(d, access={"api_key_proxy": proxy}))
            assert list(conf["receivers"]) == ["prometheus"], name
            [job] = conf["receivers"]["prometheus"]["config"]["scrape_configs"]
            assert job["static_configs"] == [{"targets": [f"127.0.0.1:{port}"]}], (name, proxy)
            assert (job["scrape_interval"], job["metrics_path"], job["scheme"]) == (
                "15s", "/metrics", "http")
            # vLLM's own port needs no key on loopback: no credential of any kind.
            assert not {"authorization", "basic_auth", "bearer_token", "bearer_token_file",
                        "oauth2", "tls_config"} & set(job)
            pipeline = conf["service"]["pipelines"]
            assert list(pipeline) == ["metrics"]
            assert pipeline["metrics"]["receivers"] == ["prometheus"]
            assert pipeline["metrics"]["exporters"] == ["googlemanagedprometheus"]
            assert conf["exporters"] == {"googlemanagedprometheus": {"project": d.gcp.project}}


def test_every_series_carries_the_stack_labels(serving: dict[str, Deployment]) -> None:
    seen = set()
    for name, d in serving.items():
        conf = _conf(d)
        actions = conf["processors"]["attributes/tpuserve"]["actions"]
        got = {a["key"]: a["value"] for a in actions}
        assert {a["action"] for a in actions} == {"upsert"}
        assert got == {
            "stack": name, "provisioning_model": d.stack.provisioning_model,
            "deployment": d.gcp.deployment, "node": d.node_name, "project": d.gcp.project,
            "zone": d.gcp.zone,
        } == metric_labels(d)
        assert tuple(got) == LABELS
        resource = {a["key"]: a["value"] for a in conf["processors"]["resource/tpuserve"][
            "attributes"]}
        assert resource == {"location": d.gcp.zone, "cluster": d.gcp.deployment,
                            "namespace": name, "service.instance.id": d.node_name}
        processors = conf["service"]["pipelines"]["metrics"]["processors"]
        assert set(processors) == set(conf["processors"])
        assert processors.index("memory_limiter") == 0 and processors[-1] == "batch"
        seen.add(got["node"])
    assert len(seen) == len(serving)  # one series per node: nothing collides in GMP


def test_it_listens_on_no_port_and_holds_no_secret(serving: dict[str, Deployment]) -> None:
    d = serving["spot"]
    text = startup_context(d)["collector_conf"]
    conf = yaml.safe_load(text)
    keys = {k for k, _ in _walk(conf)}
    # No extension (health_check, zpages, pprof), no receiver that listens (otlp), no
    # telemetry server (level none: no :8888).
    assert conf["service"].get("extensions", []) == [] and "extensions" not in conf
    assert conf["service"]["telemetry"]["metrics"] == {"level": "none"}
    assert not keys & {"endpoint", "address", "readers", "otlp", "health_check", "zpages",
                       "pprof", "listen_address"}
    assert not re.search(r"0\.0\.0\.0|:8888|:13133|:55679", text)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"(?i)bearer|password|api.?key|token|secret|credential", body)
    assert d.api_key_secret_id not in text and d.hf_token_secret_id not in text


def test_values_stay_scalars_and_dollar_signs_stay_literal(
    serving: dict[str, Deployment],
) -> None:
    d = serving["spot"]
    odd = 'p"roj\n$HOME ${env:X}: [x] # y'
    hostile = d.model_copy(update={"gcp": d.gcp.model_copy(update={"project": odd})})
    text = render_collector_conf(hostile, backend_port=8001)
    conf = yaml.safe_load(text)
    # The collector reads `$$` as a literal `$`, so nothing is expanded from its environment.
    literal = odd.replace("$", "$$")
    assert conf["exporters"]["googlemanagedprometheus"]["project"] == literal
    labels = {a["key"]: a["value"] for a in conf["processors"]["attributes/tpuserve"]["actions"]}
    assert labels["project"] == literal
    assert list(conf) == ["receivers", "processors", "exporters", "service"]


def test_the_image_is_pinned_and_on_by_default(serving: dict[str, Deployment]) -> None:
    m = serving["spot"].monitoring
    repo, _, version = m.collector_image.partition(":")
    assert repo == "otel/opentelemetry-collector-contrib"
    assert re.fullmatch(r"\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?", version)
    assert m.metrics is True
    for moving in ("otel/opentelemetry-collector-contrib",
                   "otel/opentelemetry-collector-contrib:latest", "otel/x y:1"):
        raw = load_raw(environ={})
        raw["monitoring"] = {**raw.get("monitoring", {}), "collector_image": moving}
        with pytest.raises(ConfigError, match=r"monitoring\.collector_image"):
            from_raw(raw)


def _settings(script: str, tmp_path: Path, expr: str) -> str:
    block = script[script.index("# --- settings"):script.index("# --- end settings ---")]
    proc = subprocess.run(["bash", "-c", f"set -eu\n{block}\nprintf '%s' {expr}"],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    return proc.stdout


def test_the_boot_script_carries_it_verbatim_or_nothing_when_off(
    serving: dict[str, Deployment], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = serving["spot"]
    script = render_startup(d)
    assert _settings(script, tmp_path, '"$METRICS_CONF_TEXT"') + "\n" == render_collector_conf(
        d, backend_port=8001)
    assert _settings(script, tmp_path, '"$METRICS_IMAGE"') == d.monitoring.collector_image
    assert _settings(script, tmp_path, '"$METRICS_CONF_PATH"') == "/etc/otelcol-contrib/config.yaml"
    d = d.model_copy(update={"monitoring": d.monitoring.model_copy(update={"metrics": False})})
    off = render_startup(d)
    assert startup_context(d)["collector_conf"] == ""
    assert _settings(off, tmp_path, '"$METRICS_CONF_TEXT"') == ""
