"""The secrets part: fetching, waiting for a version, a bad key, rotation."""

from __future__ import annotations

import os
import time

from tests.render.boot.support import (
    NAMESPACE,
    Cloud,
    _get,
    _story,
    _tls,
    wait_for,
)


def test_an_api_key_that_is_not_a_token_fails_the_boot_without_showing_it(cloud: Cloud) -> None:
    cloud.api_key = 'bad "key" with spaces; return 200'
    cloud.secrets.add_version(cloud.deployment.api_key_secret_id, cloud.api_key.encode())
    node = cloud.node()
    out = node.run(expect_rc=1)
    assert node.attrs()["state"].startswith("failed secret tpuserve-api-key is not a usable")
    assert "openssl rand -base64 32" in out
    assert cloud.api_key not in out
    assert node.docker_commands("run") == []


def test_secrets_without_a_usable_version_wait_with_a_log_line_then_proceed(
    cloud: Cloud,
) -> None:
    d = cloud.deployment
    cloud.secrets.secrets[d.hf_token_secret_id] = []  # deployed, no version added yet
    cloud.secrets.set_state(d.api_key_secret_id, 1, "DISABLED")  # latest version disabled
    node = cloud.node()
    proc = node.start()
    try:
        wait_for(lambda: node.attrs().get("state", "").startswith("waiting"), "waiting state")
        wait_for(lambda: len(cloud.secrets.calls_for(d.hf_token_secret_id)) >= 3, "polls")
        assert "container" not in node.attrs()
        cloud.secrets.add_version(d.hf_token_secret_id, cloud.hf_token.encode())
        wait_for(lambda: len(cloud.secrets.calls_for(d.api_key_secret_id)) >= 3, "key polls")
        assert "container" not in node.attrs()
        cloud.secrets.add_version(d.api_key_secret_id, cloud.api_key.encode())
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    for secret, why in ((d.hf_token_secret_id, "NOT_FOUND"),
                        (d.api_key_secret_id, "FAILED_PRECONDITION")):
        assert (f"waiting for an enabled version of secret {secret} ({why}); add one: "
                f"gcloud secrets versions add {secret} --project {d.gcp.project}") in out
    states = [v for k, v in _story(cloud.metadata.writes_in(NAMESPACE)) if k == "state"]
    assert states == ["booting", f"waiting for a version of secret {d.hf_token_secret_id}",
                      "booting", f"waiting for a version of secret {d.api_key_secret_id}",
                      "booting", "ready"]


def test_rotated_secrets_replace_only_the_proxy_and_a_reboot_replaces_both(cloud: Cloud) -> None:
    d = cloud.deployment
    node = cloud.node()
    node.run()
    token_file = node.root / "run/tpuserve/secrets/hf_token"
    inode = token_file.stat().st_ino
    cloud.api_key = "tpk-rotated-" + os.urandom(16).hex()
    cloud.hf_token = "hf_rotated" + os.urandom(16).hex()
    cloud.secrets.add_version(d.api_key_secret_id, cloud.api_key.encode())
    cloud.secrets.add_version(d.hf_token_secret_id, cloud.hf_token.encode())
    rerun = time.time()
    node.run()
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", rerun)]
    assert started == ["tpuserve-proxy"]  # nginx reads the key at start; vLLM keeps serving
    assert _get(cloud.public_port, "/v1/models", cloud.api_key, tls=_tls(node)) == 200
    # Rewritten in place: the running container's read-only mount sees the new token.
    assert token_file.stat().st_ino == inode and token_file.read_text() == cloud.hf_token

    node.stop()  # power off: processes die, the tmpfs empties, the disk stays
    for f in (node.root / "run").rglob("*"):
        if f.is_file():
            f.unlink()
    # Another node whose clock runs ahead touched the object last: customTime cannot move
    # back, so this boot's touch is refused, logged, and the later value stays.
    later = "2099-01-01T00:00:00.000Z"
    cloud.storage.objects[cloud.cache_object(node)].custom_time = later
    rebooted = time.time()
    out = node.run()
    removed = [argv[-1] for argv in node.docker_commands("rm", rebooted)]
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", rebooted)]
    # Every container, the metrics collector's too (docker itself would restart that one).
    assert sorted(removed) == sorted(started) == ["tpuserve-metrics", "tpuserve-proxy",
                                                  "vllm-gemma4"]
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["container"] == "started"
    assert attrs["cache"].startswith("local files=6")  # the disk kept the compile cache
    assert len(cloud.storage.calls_of("download")) == 1  # only the first boot's miss
    assert attrs["cache_publish"].endswith(" custom_time=failed HTTP 400 invalid")
    assert "could not set customTime of gs://" in out
    assert cloud.custom_time(cloud.cache_object(node)) == later
