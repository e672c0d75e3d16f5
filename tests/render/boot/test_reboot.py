"""A reboot converges like a first boot. dockerd restarts the
--restart unless-stopped containers at boot, before the startup script and before the secrets
tmpfs exists: the fake docker's `__daemon_start__` emulates it from docker's documented
behaviour (missing -v bind sources created as empty directories, moby#21390; a crash loop
inspecting as Running=true, Restarting=true). Emulated, not measured on a node."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time

import pytest

from tests.render.boot.support import ROOMY, Cloud, Node, _get, _tls, wait_for
from tpuserve.render.boot_script import render_startup

VLLM = "vllm-gemma4"
PROXY = "tpuserve-proxy"


def _inspect(node: Node, name: str) -> dict:
    out = subprocess.run([str(node.bin / "docker"), "inspect", name], env=node.env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]


def _secret_sources(doc: dict, node: Node) -> list[str]:
    secrets = str(node.root / "run/tpuserve/secrets")
    return [m["Source"] for m in doc["Mounts"] if m["Source"].startswith(secrets + "/")]


@pytest.mark.parametrize("model", ["gated", "ungated"])
def test_a_reboot_with_dockerd_restarting_the_containers_comes_back_healthy(
    cloud: Cloud, model: str,
) -> None:
    # Gated: vLLM cannot read its token and crash-loops. Ungated: it serves on, with a stale
    # mount; either way it inspects as running.
    node = cloud.node(**ROOMY, **({"FAKE_VLLM_UNGATED": "1"} if model == "ungated" else {}))
    node.run()
    node.reboot()
    secrets = node.root / "run/tpuserve/secrets"
    # What dockerd left: empty directories where the secret files were mounted from.
    assert (secrets / "hf_token").is_dir() and (secrets / "api-key.conf").is_dir()

    def vllm_looks_running() -> bool:
        state = _inspect(node, VLLM)["State"]
        if model == "gated":  # in docker's restart loop, and still "running"
            return state["Running"] and state["Restarting"] and \
                _inspect(node, VLLM)["RestartCount"] >= 1
        return state["Running"] and not state["Restarting"]

    wait_for(vllm_looks_running, "vLLM restarted by dockerd")
    stale = _inspect(node, VLLM)
    assert all(not (node.root / s).is_file() for s in _secret_sources(stale, node))

    since = time.time()
    node.run()  # the startup script, with no config change
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["container"] == "started"
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", since)]
    assert VLLM in started and PROXY in started
    # Every secret mount is now the tmpfs file, and the server read the current token.
    for name in (VLLM, PROXY):
        doc = _inspect(node, name)
        assert doc["Id"] != stale["Id"] or name == PROXY
        assert doc["State"]["Restarting"] is False
        sources = _secret_sources(doc, node)
        assert sources and all((secrets / s.rsplit("/", 1)[1]).is_file() for s in sources)
    token_sha = (node.docker_state / f"containers/{VLLM}.token-sha256").read_text()
    assert token_sha == hashlib.sha256(cloud.hf_token.encode()).hexdigest()
    assert not [p for p in secrets.iterdir() if p.is_dir()]
    assert _get(cloud.public_port, "/v1/models", cloud.api_key, tls=_tls(node)) == 200
    assert _get(cloud.public_port, "/v1/models", tls=_tls(node)) == 401


def test_a_container_whose_secret_mount_became_a_directory_is_replaced(cloud: Cloud) -> None:
    """The tmpfs stays (no reboot), but a secret file is gone and docker made a directory of
    it (a restart of the container while the file was missing): that container is replaced."""
    node = cloud.node(**ROOMY)
    node.run()
    token = node.root / "run/tpuserve/secrets/hf_token"
    serving = node.container(VLLM)
    token.unlink()
    token.mkdir()
    since = time.time()
    node.run()
    assert node.attrs()["state"] == "ready"
    assert node.container(VLLM)["id"] != serving["id"]
    assert token.is_file() and token.read_text().strip() == cloud.hf_token
    assert [argv[-1] for argv in node.docker_commands("rm", since)][:1] == [VLLM]


def test_a_reboot_with_a_changed_config_and_a_rotated_key_comes_back_on_both(
    cloud: Cloud,
) -> None:
    """While the node was down its script changed (a vLLM setting) and its key was rotated
    (the old version disabled): the boot after dockerd's restarts runs the new argv with the
    new key, every secret mount a tmpfs file, and the old key is refused."""
    node = cloud.node(**ROOMY)
    node.run()
    d, old_key = node.deployment, cloud.api_key
    node.reboot()
    new = d.model_copy(update={"vllm": d.vllm.model_copy(update={"max_num_batched_tokens": 8192})})
    node.script.write_text(render_startup(new, backend_port=cloud.backend_port))
    key = "tpk-rebooted-" + hashlib.sha256(old_key.encode()).hexdigest()[:32]
    cloud.secrets.add_version(d.api_key_secret_id, key.encode())
    cloud.secrets.set_state(d.api_key_secret_id, 1, "DISABLED")
    node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready"
    prefix = hashlib.sha256(key.encode()).hexdigest()[:12]
    assert attrs["secret"] == f"fetched api_key_sha256={prefix}"
    assert "8192" in node.container(VLLM)["cmd"]
    secrets = node.root / "run/tpuserve/secrets"
    for name in (VLLM, PROXY):
        sources = _secret_sources(_inspect(node, name), node)
        assert sources and all((secrets / s.rsplit("/", 1)[1]).is_file() for s in sources)
    tls = _tls(node)
    assert _get(cloud.public_port, "/v1/models", key, tls=tls) == 200
    assert _get(cloud.public_port, "/v1/models", old_key, tls=tls) == 401
    assert _get(cloud.public_port, "/v1/models", tls=tls) == 401


def _port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_after_a_reboot_the_port_stays_closed_until_a_boot_has_the_current_key(
    cloud: Cloud,
) -> None:
    """The key was revoked while the node was down, and the boot after the reboot fails before
    it reads the secrets (Secret Manager down): the proxy dockerd restarted mounts a directory
    where its key rule was (nginx refuses to include it: it never listens), the boot removes it
    before fetching, and nothing serves the old key."""
    node = cloud.node(**ROOMY)
    node.run()
    d = node.deployment
    node.reboot()
    cloud.secrets.set_state(d.api_key_secret_id, 1, "DISABLED")
    time.sleep(1)  # dockerd's restarts have had their moment
    assert _port_closed(cloud.public_port)
    cloud.secrets.outage = True
    node.run(expect_rc=1, timeout=120)
    assert node.attrs()["state"].startswith("failed could not read secret")
    assert _port_closed(cloud.public_port)
    # Removed before the secrets were read (reap_stale_mounts): no proxy to serve the old key.
    assert subprocess.run([str(node.bin / "docker"), "inspect", PROXY], env=node.env,
                          capture_output=True, check=False).returncode != 0
