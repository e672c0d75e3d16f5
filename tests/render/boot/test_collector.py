"""The metrics part: the collector container started after vLLM, kept on a re-run, replaced
when its config changes, best effort when it cannot start, removed when switched off."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.render.boot.support import Cloud, Node
from tpuserve.render import collector_conf
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import Deployment

NAME = "tpuserve-metrics"
CONF_PATH = "/etc/otelcol-contrib/config.yaml"


def _names(node: Node, verb: str, since: float = 0) -> list[str]:
    return [argv[argv.index("--name") + 1] if verb == "run" else argv[-1]
            for argv in node.docker_commands(verb, since)]


def _rerender(node: Node) -> None:
    """The script rendered again from the node's config (as a metadata update would)."""
    node.script.write_text(render_startup(node.deployment, backend_port=node.cloud.backend_port))


def _metrics(d: Deployment, on: bool) -> Deployment:
    """`d` with [monitoring] metrics switched."""
    return d.model_copy(update={"monitoring": d.monitoring.model_copy(update={"metrics": on})})


def test_a_boot_starts_the_collector_after_vllm_and_a_rerun_keeps_it(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = cloud.node()
    node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["metrics"] == "started"
    # Recorded between the container phase and readiness.
    keys = [w.key for w in cloud.metadata.writes]
    assert keys.index("config") < keys.index("metrics") < keys.index("memory")
    assert _names(node, "run") == ["vllm-gemma4", "tpuserve-proxy", NAME]

    conf_file = node.root / "var/lib/tpuserve/otelcol.yaml"
    conf = yaml.safe_load(conf_file.read_text())
    [job] = conf["receivers"]["prometheus"]["config"]["scrape_configs"]
    vllm_cmd = node.container("vllm-gemma4")["cmd"]
    assert vllm_cmd[-4:-2] == ["--host", "127.0.0.1"]
    assert job["static_configs"] == [{"targets": [f"127.0.0.1:{vllm_cmd[-1]}"]}]
    labels = {a["key"]: a["value"] for a in conf["processors"]["attributes/tpuserve"]["actions"]}
    assert labels["node"] == node.deployment.node_name and labels["stack"] == "spot"

    c = node.container(NAME)
    assert c["image"] == node.deployment.monitoring.collector_image
    assert c["cmd"] == [f"--config={CONF_PATH}"]
    assert (c["network"], c["restart"], c["privileged"]) == ("host", "unless-stopped", False)
    assert c["volumes"] == [f"{conf_file}:{CONF_PATH}:ro"]
    # The metadata server the node uses is the collector's (its credentials); nothing else.
    assert c["env"] == [f"GCE_METADATA_HOST={cloud.metadata.host}"]
    [run] = [argv for argv in node.docker_commands("run") if NAME in argv]
    assert "--read-only" in run and "-p" not in run and "--publish" not in run
    log = (node.docker_state / f"containers/{NAME}.log").read_text()
    assert f"config {CONF_PATH} read" in log  # the mount and --config agree

    # No secret in its config, its argv, its container's env or the docker call's env.
    call = next(c for c in node.docker_calls() if c["argv"][:1] == ["run"] and NAME in c["argv"])
    places = {"config": conf_file.read_text(), "argv": json.dumps(run),
              "container env": json.dumps(c["env"]), "docker call env": json.dumps(call["env"])}
    leaks = [f"{what} in {where}" for what, value in cloud.secret_values.items()
             for where, text in places.items() if value in text]
    assert leaks == []

    # A re-run keeps it.
    since = time.time()
    node.run()
    assert node.attrs()["metrics"] == "reused"
    assert _names(node, "run", since) == [] and _names(node, "rm", since) == []
    pid = node.container(NAME)["pid"]

    # A changed config replaces it, and only it: vLLM and the proxy keep serving.
    monkeypatch.setattr(collector_conf, "SCRAPE_INTERVAL_S", 30)
    _rerender(node)
    since = time.time()
    node.run()
    assert node.attrs()["metrics"] == "started" and node.attrs()["state"] == "ready"
    assert _names(node, "run", since) == [NAME]
    assert NAME in _names(node, "rm", since)
    assert node.container(NAME)["pid"] != pid
    job = yaml.safe_load(conf_file.read_text())["receivers"]["prometheus"]["config"][
        "scrape_configs"][0]
    assert job["scrape_interval"] == "30s"


def test_a_collector_that_cannot_start_does_not_fail_the_boot(cloud: Cloud) -> None:
    node = cloud.node(FAKE_DOCKER_RUN_FAIL=NAME)
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["health"] == "ok"
    assert attrs["metrics"].startswith(
        f"failed docker run {NAME}: docker: Error response from daemon: ")
    assert "vLLM serves without it" in out
    # vLLM, the proxy, then the collector's tries (retried for 60 scaled seconds: at least one).
    assert _names(node, "run")[:3] == ["vllm-gemma4", "tpuserve-proxy", NAME]
    assert set(_names(node, "run")[2:]) == {NAME}
    assert not (node.docker_state / f"containers/{NAME}.json").exists()
    assert not (node.root / "run/tpuserve/metrics.err").exists()


def test_the_off_switch_runs_no_collector_and_removes_a_running_one(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = cloud.node(_metrics(cloud.deployment, False))
    node.run()
    assert node.attrs()["metrics"] == "off" and node.attrs()["state"] == "ready"
    assert NAME not in _names(node, "run")
    conf_file = node.root / "var/lib/tpuserve/otelcol.yaml"
    assert not conf_file.exists()

    node.deployment = _metrics(node.deployment, True)
    _rerender(node)
    node.run()
    assert node.attrs()["metrics"] == "started" and conf_file.exists()

    node.deployment = _metrics(node.deployment, False)
    _rerender(node)
    since = time.time()
    out = node.run()
    assert node.attrs()["metrics"] == "off"
    assert f"the metrics collector is off in config: removing {NAME}" in out
    assert _names(node, "rm", since) == [NAME] and _names(node, "run", since) == []
    assert not (node.docker_state / f"containers/{NAME}.json").exists()
    assert not conf_file.exists()
