"""A key can be rotated and revoked on a running node. The watcher runs the
key refresher a boot leaves (STATE_DIR/refresh_key.sh) at most every KEY_REFRESH_S (300 s,
scaled): it reads the API-key secret's latest version and, when it changed, rewrites the
proxy's rule in place and reloads nginx (Debian's real nginx in the fake docker when it is
installed: a real reload, the same master process)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from tests.render.boot.support import ROOMY, Cloud, Node, _get, _tls, wait_for
from tpuserve.gcp.secret_versions import (
    add_version,
    disable_version,
    enabled_versions,
    secretmanager,
)
from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.ops.key_rotation import generate_key, key_prefix, wait_for_prefix

KEY = "startup-script"
PROXY = "tpuserve-proxy"


def _prefix(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _booted(cloud: Cloud) -> Node:
    node = cloud.node(**ROOMY)  # the refresher every 3 s, the readiness budget 24 s
    cloud.metadata.set_attribute(KEY, node.script.read_text())
    node.run()
    wait_for(lambda: "reconverge" in node.attrs(), "the watcher's first record")
    return node


def test_a_rotated_key_reaches_the_node_and_the_disabled_old_one_is_refused(
    cloud: Cloud,
) -> None:
    node = _booted(cloud)
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    old = cloud.api_key
    assert node.attrs()["secret"] == f"fetched api_key_sha256={_prefix(old)}"
    assert _get(port, "/v1/models", old, tls=tls) == 200
    proxy = node.container(PROXY)

    new = "tpk-rotated-" + os.urandom(16).hex()
    rotated_at = time.time()
    cloud.secrets.add_version(d.api_key_secret_id, new.encode())
    cloud.secrets.set_state(d.api_key_secret_id, 1, "DISABLED")
    wait_for(lambda: node.attrs().get("secret") == f"reloaded api_key_sha256={_prefix(new)}",
             "the node to report the new key", timeout=60)
    print(f"\nrotation on the fakes (TPUSERVE_TIME_SCALE=0.01: 300 s -> 3 s): new key reported "
          f"{time.time() - rotated_at:.1f} s after the new version")
    assert _get(port, "/v1/models", old, tls=tls) == 401
    assert _get(port, "/v1/models", new, tls=tls) == 200
    assert _get(port, "/health", tls=tls) == 200
    assert _get(port, "/v1/models", tls=tls) == 401
    # A reload, not a restart: the same container and process, no docker run since.
    assert node.container(PROXY)["pid"] == proxy["pid"]
    assert node.docker_commands("run", rotated_at) == []
    assert ["kill", "-s", "HUP", PROXY] in node.docker_commands("kill", rotated_at)
    # The key is in no argv of the refresher's probes: header files in the tmpfs.
    assert new not in node.spy_log.read_text()
    assert not list((node.root / "run/tpuserve/secrets").glob(".probe-header*"))


def test_a_revoked_key_with_no_enabled_version_left_shuts_every_key_out(cloud: Cloud) -> None:
    node = _booted(cloud)
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    cloud.secrets.set_state(d.api_key_secret_id, 1, "DISABLED")
    wait_for(lambda: node.attrs().get("secret", "").startswith("revoked"),
             "the node to shut the key out", timeout=60)
    assert node.attrs()["secret"] == (
        f"revoked secret {d.api_key_secret_id} has no enabled latest version (HTTP 400 "
        "FAILED_PRECONDITION): no key opens the proxy")
    assert _get(port, "/v1/models", cloud.api_key, tls=tls) == 401
    assert _get(port, "/health", tls=tls) == 200


def test_a_secret_manager_outage_keeps_the_key_in_use(cloud: Cloud) -> None:
    node = _booted(cloud)
    port, tls = cloud.public_port, _tls(node)
    cloud.secrets.outage = True
    since = time.time()
    wait_for(lambda: any(c.at >= since and c.status == 503 for c in
                         cloud.secrets.calls_for(cloud.deployment.api_key_secret_id)),
             "a refresh during the outage", timeout=60)
    time.sleep(0.5)
    assert _get(port, "/v1/models", cloud.api_key, tls=tls) == 200
    assert node.attrs()["secret"] == f"fetched api_key_sha256={_prefix(cloud.api_key)}"


class _NodeAttrs:
    """rotate-key's view of the node (a TpuSource): READY, its guest attributes those the
    booted node wrote to the fake metadata server."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def get_node(self, d: object) -> NodeView:
        return NodeView("n", "READY", "HEALTHY", "127.0.0.1", None, "v6e-8", True)

    def guest_attributes(self, d: object, namespace: str) -> dict[str, str]:
        return self.cloud.metadata.namespace(namespace)

    def get_queued_resource(self, ref: object) -> None:
        return None


def test_rotate_key_adds_a_version_and_waits_for_the_real_node_to_report_it(
    cloud: Cloud,
) -> None:
    node = _booted(cloud)
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    old = cloud.api_key
    api = secretmanager(environ={"CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER":
                                 cloud.secrets.endpoint,
                                 "CLOUDSDK_AUTH_ACCESS_TOKEN": cloud.access_token})
    before = enabled_versions(api, d.gcp.project, d.api_key_secret_id)
    key = generate_key()
    version = add_version(api, d.gcp.project, d.api_key_secret_id, key)
    _, reported = wait_for_prefix(d, tpu=_NodeAttrs(cloud), prefix=key_prefix(key),
                                  timeout_s=60, poll_s=0.05)
    assert reported == f"reloaded api_key_sha256={key_prefix(key)}"
    assert version.endswith("/versions/2") and before[0].endswith("/versions/1")
    assert _get(port, "/v1/models", key.decode(), tls=tls) == 200
    assert _get(port, "/v1/models", old, tls=tls) == 401
    disable_version(api, before[0])
    assert [v.state for v in cloud.secrets.secrets[d.api_key_secret_id]] == [
        "DISABLED", "ENABLED"]


@pytest.mark.parametrize("next_run", ["refresher", "boot"])
def test_a_refresher_killed_between_the_rewrite_and_the_reload_is_finished_by_the_next(
    cloud: Cloud, next_run: str,
) -> None:
    # The watcher kills a refresher at its bound (REFRESH_MAX_S), a stopped unit kills it too:
    # one killed after it rewrote the key files but before nginx reloaded leaves nginx on the
    # old rule. The next refresher found the files current and did nothing: the old key was
    # taken for good, and a boot kept the proxy (the rule file unchanged). Now the reload owed
    # (api-key.old left behind) is finished by the refresher, or the boot starts a fresh proxy.
    node = _booted(cloud)
    node.stop_watcher()
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    old = cloud.api_key
    docker = node.bin / "docker"
    real = docker.read_text()
    docker.write_text('#!/bin/sh\n[ "$1" = kill ] && sleep 60\n' + real.split("\n", 1)[1])
    refresher = node.root / "var/lib/tpuserve/refresh_key.sh"
    key_file = node.root / "run/tpuserve/secrets/api-key"
    new = "tpk-rotated-" + os.urandom(16).hex()
    cloud.secrets.add_version(d.api_key_secret_id, new.encode())
    stuck = subprocess.Popen(["bash", str(refresher)], env=node.env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: key_file.read_text() == new, "the refresher to rewrite the key file")
        time.sleep(0.5)  # in docker kill now
    finally:
        os.killpg(stuck.pid, signal.SIGKILL)
        stuck.wait()
    docker.write_text(real)
    assert _get(port, "/v1/models", old, tls=tls) == 200  # nginx still holds the old rule
    if next_run == "refresher":
        subprocess.run(["bash", str(refresher)], env=node.env, check=True, timeout=60,
                       capture_output=True)
        assert node.attrs()["secret"] == f"reloaded api_key_sha256={_prefix(new)}"
    else:
        node.run()
        assert node.attrs()["secret"] == f"fetched api_key_sha256={_prefix(new)}"
    assert _get(port, "/v1/models", old, tls=tls) == 401
    assert _get(port, "/v1/models", new, tls=tls) == 200
    assert not (node.root / "run/tpuserve/secrets/api-key.old").exists()


def test_a_report_of_the_new_key_lost_to_a_429_storm_is_written_again_once_writes_land(
    cloud: Cloud,
) -> None:
    # Every write of `secret` throttled while the key rotates: the reload's report is lost
    # after ga's retries. The key then stays the same, and the refresher, finding nothing to
    # reload, never wrote it again: rotate-key waited for good on a node using the new key.
    # The lost value is owed (lib.sh's ga_owe): the watcher writes it once writes land again.
    node = _booted(cloud)
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    cloud.metadata.refuse_key("secret", 429, "Too Many Requests\n")
    new = "tpk-rotated-" + os.urandom(16).hex()
    cloud.secrets.add_version(d.api_key_secret_id, new.encode())
    wait_for(lambda: _get(port, "/v1/models", new, tls=tls) == 200, "the reload", timeout=60)
    wait_for(lambda: "guest attribute secret: not written (HTTP 429" in node.watch_log.read_text(),
             "the report of the new key to be lost", timeout=60)
    assert node.attrs()["secret"] == f"fetched api_key_sha256={_prefix(cloud.api_key)}"
    del cloud.metadata.refused_keys["secret"]
    wait_for(lambda: node.attrs().get("secret") == f"reloaded api_key_sha256={_prefix(new)}",
             "the owed report of the key in use to land", timeout=60)
    owed = node.root / "run/tpuserve/ga-owed/secret"
    wait_for(lambda: not owed.exists(), "the owed report to be settled")


def test_a_secret_manager_dripping_its_answer_to_the_refresher_costs_one_retry(
    cloud: Cloud,
) -> None:
    # The refresher's read of the new version drips a byte every 0.5 s: curl's --max-time
    # ends it, api_retry reads again, and the new key is reloaded as without the drip.
    node = _booted(cloud)
    d, port, tls = cloud.deployment, cloud.public_port, _tls(node)
    new = "tpk-rotated-" + os.urandom(16).hex()
    cloud.secrets.drip_next(1)
    cloud.secrets.add_version(d.api_key_secret_id, new.encode())
    wait_for(lambda: node.attrs().get("secret") == f"reloaded api_key_sha256={_prefix(new)}",
             "the node to report the new key", timeout=90)
    assert cloud.secrets.drip_accesses == 0
    assert _get(port, "/v1/models", new, tls=tls) == 200
    assert _get(port, "/v1/models", cloud.api_key, tls=tls) == 401
