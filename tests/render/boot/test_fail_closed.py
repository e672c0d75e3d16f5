"""A check that detects a hole closes it, and only a script that reached
readiness is applied. The real boot script under bash against the fakes; the proxy is Debian's
real nginx in the fake docker when it is installed (tests/fakes/docker)."""

from __future__ import annotations

import hashlib
import re
import socket
import time

import pytest

from tests.render.boot.support import ROOMY, Cloud, Node, wait_for
from tpuserve.render.boot_script import render_startup

KEY = "startup-script"
PROXY = "tpuserve-proxy"
# The retries of a re-run fit in one readiness budget: room for several boots.
SCALE = ROOMY


def _reconverge(cloud: Cloud, since: float = 0) -> list[str]:
    return [w.value.split(" ", 1)[1] for w in cloud.metadata.writes_in("tpuserve")
            if w.key == "reconverge" and w.at >= since]


def _final(cloud: Cloud, since: float) -> list[str]:
    return [v for v in _reconverge(cloud, since) if v.startswith(("applied", "failed"))]


def _port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _booted(cloud: Cloud, node: Node) -> None:
    node.env.update(SCALE)
    cloud.metadata.set_attribute(KEY, node.script.read_text())
    node.run()
    wait_for(lambda: _reconverge(cloud), "the watcher's first record")


def _new_proxy_script(cloud: Cloud, node: Node) -> str:
    """A config change that replaces the proxy (another image tag of nginx)."""
    d = node.deployment
    d = d.model_copy(update={"access": d.access.model_copy(
        update={"proxy_image": "nginx:1.27.4-alpine"})})
    return render_startup(d, backend_port=cloud.backend_port)


def test_a_proxy_that_answers_without_the_key_on_a_first_boot_is_stopped(cloud: Cloud) -> None:
    node = cloud.node(**SCALE)
    (node.docker_state / "nginx_open").touch()  # an nginx that lost its key rule
    node.run(expect_rc=1)
    state = node.attrs()["state"]
    # Checked as soon as the proxy answers, before readiness: the open proxy's 502 (vLLM not
    # up yet) or 200 (up already: the fake starts in a moment) is not a proxy's 401.
    assert re.fullmatch(
        r"failed the proxy does not require the API key \(GET /v1/models without a key: HTTP "
        rf"(502|200)\); proxy stopped: port {cloud.public_port} closed", state), state
    assert "health" not in node.attrs()  # removed before the boot's readiness
    assert not (node.docker_state / f"containers/{PROXY}.json").exists()
    assert _port_closed(cloud.public_port)
    assert "bypass_check" not in node.attrs()


def test_a_proxy_that_takes_any_key_is_stopped(cloud: Cloud) -> None:
    node = cloud.node(**SCALE)
    (node.docker_state / "nginx_any_key").touch()  # a rule that checks only "Bearer "
    node.run(expect_rc=1)
    assert re.fullmatch(
        r"failed the proxy takes a wrong API key \(GET /v1/models with a wrong key: HTTP "
        rf"(502|200)\); proxy stopped: port {cloud.public_port} closed", node.attrs()["state"])
    assert _port_closed(cloud.public_port)
    assert not list((node.root / "run/tpuserve/secrets").glob(".wrong-key*"))


def test_a_proxy_that_answers_without_the_key_on_a_watcher_rerun_is_stopped(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    _booted(cloud, node)
    (node.docker_state / "nginx_open").touch()
    script = _new_proxy_script(cloud, node)
    since = time.time()
    cloud.metadata.set_attribute(KEY, script)
    wait_for(lambda: _final(cloud, since), "the re-run's end", timeout=120)
    words = _reconverge(cloud, since)
    why = ("the proxy does not require the API key (GET /v1/models without a key: HTTP 200); "
           f"proxy stopped: port {cloud.public_port} closed")
    assert words[-1] == f"failed sha256={_sha(script)} {why}"
    # Retried (a failed step is run again) and each attempt closed the port again.
    assert [w.split(" ")[2] for w in words if w.startswith("retrying")] == [
        "attempt=2/4", "attempt=3/4", "attempt=4/4"]
    assert node.attrs()["state"] == f"failed {why}"
    assert not (node.docker_state / f"containers/{PROXY}.json").exists()
    assert _port_closed(cloud.public_port)


def test_a_rerun_whose_proxy_cannot_start_is_retried_until_it_does(cloud: Cloud) -> None:
    node = cloud.node()
    _booted(cloud, node)
    (node.docker_state / "run_fail").write_text(PROXY + "\n")
    script = _new_proxy_script(cloud, node)
    since = time.time()
    cloud.metadata.set_attribute(KEY, script)
    wait_for(lambda: any(v.startswith("retrying") for v in _reconverge(cloud, since)),
             "a retry", timeout=120)
    (node.docker_state / "run_fail").unlink()  # the registry answers again
    wait_for(lambda: _final(cloud, since), "the re-run's end", timeout=120)
    words = _reconverge(cloud, since)
    assert words[1].startswith(f"retrying sha256={_sha(script)} attempt=2/4 in=30s "
                               f"docker run {PROXY} failed")
    assert words[-1] == f"applied sha256={_sha(script)}"
    assert node.attrs()["state"] == "ready"
    assert node.container(PROXY)["image"] == "nginx:1.27.4-alpine"


@pytest.mark.parametrize("cut_before", ["PHASE=readiness", "PHASE=container"])
def test_a_truncated_script_is_not_applied(cloud: Cloud, cut_before: str) -> None:
    node = cloud.node()
    _booted(cloud, node)
    full = _new_proxy_script(cloud, node)
    # Metadata cut short at a line: bash runs what is there and exits 0.
    truncated = full[:full.rindex("\n" + cut_before + "\n") + 1]
    since = time.time()
    cloud.metadata.set_attribute(KEY, truncated)
    wait_for(lambda: _final(cloud, since), "the re-run's end", timeout=120)
    words = _reconverge(cloud, since)
    phase = {"PHASE=readiness": "metrics", "PHASE=container": "cache"}[cut_before]
    why = f"the script ended before readiness (phase {phase}; truncated?)"
    assert words[-1] == f"failed sha256={_sha(truncated)} {why}"
    assert len([w for w in words if w.startswith("retrying")]) == 3
    assert node.attrs()["state"] == f"failed {why}"
    assert (node.root / "run/tpuserve/boot.result").read_text() == \
        f"{_sha(truncated)} failed {why}\n"
