"""`tpuserve rotate-key STACK` against the fake Secret Manager and the fake TPU API: a new
version (addVersion, its payload and CRC32C as the v1 discovery document has them), then the
node's `secret` guest attribute naming the new key's SHA-256 prefix. Here a thread plays the
node's key refresher; tests/render/boot/test_key_rotation.py has the real one."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import PROJECT, Env, assert_one_line_error, ga, invoke
from tests.fakes.secretmanager import FakeSecretManager
from tpuserve.gcp.secret_versions import crc32c
from tpuserve.ops.key_rotation import KEY_RE
from tpuserve.render.boot_script import boot_helper_text

OLD_KEY = b"tpk-old-0123456789abcdef"


@pytest.fixture
def sm(cli_env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSecretManager]:
    fake = FakeSecretManager(project=PROJECT, access_token=cli_env.tpu.token).start()
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER", fake.endpoint)
    fake.add_version(cli_env.d("spot").api_key_secret_id, OLD_KEY)
    yield fake
    fake.stop()


def _node_refreshes(env: Env, sm: FakeSecretManager, stack: str) -> threading.Thread:
    """The node's part: once a second version exists, report its key's prefix."""
    d = env.d(stack)

    def run() -> None:
        for _ in range(2000):
            versions = sm.secrets[d.api_key_secret_id]
            if len(versions) >= 2:
                prefix = hashlib.sha256(versions[-1].data).hexdigest()[:12]
                ga(env.tpu, d.node_name, {
                    "secret": f"2030-01-01T11:00:00.000Z reloaded api_key_sha256={prefix}"})
                return
            threading.Event().wait(0.01)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_key_file_becomes_the_latest_version_and_the_old_one_is_disabled_once_served(
    cli_env: Env, sm: FakeSecretManager, tmp_path: Path,
) -> None:
    d = cli_env.seed_ready("spot")
    key = b"tpk-new-" + b"A1b2C3d4" * 4
    (tmp_path / "key").write_bytes(key + b"\n")
    _node_refreshes(cli_env, sm, "spot")
    result = invoke("rotate-key", "spot", "--key-file", str(tmp_path / "key"), "--disable-old",
                    "--poll-interval", "0.02", "--timeout", "30", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    prefix = hashlib.sha256(key).hexdigest()[:12]
    assert out["key_sha256_prefix"] == prefix and "key" not in out
    assert out["version"] == f"projects/123456789012/secrets/{d.api_key_secret_id}/versions/2"
    assert out["disabled"] == [
        f"projects/123456789012/secrets/{d.api_key_secret_id}/versions/1"]
    assert out["reported"] == f"reloaded api_key_sha256={prefix}"
    versions = sm.secrets[d.api_key_secret_id]
    assert [v.state for v in versions] == ["DISABLED", "ENABLED"]
    assert versions[1].data == key and versions[1].checksummed  # stripped, with its CRC32C
    # Disabled only after the node served the new key: the last request of all.
    assert sm.requests[-1][:2] == (
        "POST", f"/v1/projects/123456789012/secrets/{d.api_key_secret_id}/versions/1:disable")
    assert key.decode() not in result.stderr


def test_a_generated_key_is_printed_once_on_stdout_and_nowhere_else(
    cli_env: Env, sm: FakeSecretManager,
) -> None:
    d = cli_env.seed_ready("spot")
    _node_refreshes(cli_env, sm, "spot")
    result = invoke("rotate-key", "spot", "--poll-interval", "0.02", "--timeout", "30")
    assert result.exit_code == 0, result.stderr
    key = sm.secrets[d.api_key_secret_id][-1].data.decode()
    assert result.stdout == key + "\n"
    assert key not in result.stderr
    assert f"api_key_sha256={hashlib.sha256(key.encode()).hexdigest()[:12]}" in result.stderr
    assert sm.secrets[d.api_key_secret_id][0].state == "ENABLED"  # no --disable-old


def test_a_node_that_never_reports_the_key_times_out_with_exit_3(
    cli_env: Env, sm: FakeSecretManager,
) -> None:
    d = cli_env.seed_ready("spot", attrs={"secret": "2030-01-01T10:00:01.000Z fetched "
                                          "api_key_sha256=000000000000"})
    result = invoke("rotate-key", "spot", "--poll-interval", "0.02", "--timeout", "0.3",
                    "--disable-old")
    assert result.exit_code == 3
    assert "did not report the new key" in result.stderr
    assert "fetched api_key_sha256=000000000000" in result.stderr
    # The new version is in place; nothing was disabled.
    assert [v.state for v in sm.secrets[d.api_key_secret_id]] == ["ENABLED", "ENABLED"]


def test_a_generated_key_survives_a_timeout_with_json(
    cli_env: Env, sm: FakeSecretManager,
) -> None:
    # The new version is the latest once added: the node takes it at its next refresh, and the
    # old key then stops working. An error document without the key lost it for good.
    d = cli_env.seed_ready("spot")
    result = invoke("rotate-key", "spot", "--poll-interval", "0.02", "--timeout", "0.3",
                    "--json")
    assert result.exit_code == 3
    out = json.loads(result.stdout)
    key = sm.secrets[d.api_key_secret_id][-1].data.decode()
    assert out["key"] == key and out["ok"] is False and out["exit_code"] == 3
    assert "did not report the new key" in out["error"]
    assert out["version"].endswith("/versions/2")
    assert key not in result.stderr
    assert_one_line_error(result, "did not report the new key")


def test_a_stack_of_kind_fleet_is_one_line_exit_2_before_any_call(
    cli_env: Env, sm: FakeSecretManager,
) -> None:
    calls = len(sm.calls)
    result = invoke("rotate-key", "fleet", "--timeout", "5")
    assert result.exit_code == 2
    assert_one_line_error(result, "Secret Manager CSI")
    assert len(sm.calls) == calls


def test_no_node_is_exit_1(cli_env: Env, sm: FakeSecretManager) -> None:
    result = invoke("rotate-key", "spot", "--timeout", "5", "--poll-interval", "0.02")
    assert result.exit_code == 1
    assert_one_line_error(result, "no node")


@pytest.mark.parametrize("content", [b"short", b"has space in the middle of it", b"\xff" * 20])
def test_an_unusable_key_file_is_one_line_before_any_call(
    cli_env: Env, sm: FakeSecretManager, tmp_path: Path, content: bytes,
) -> None:
    cli_env.seed_ready("spot")
    (tmp_path / "key").write_bytes(content)
    result = invoke("rotate-key", "spot", "--key-file", str(tmp_path / "key"))
    assert result.exit_code == 2
    assert_one_line_error(result, "--key-file", "16-512 characters", "KEY_RE")
    assert content.decode(errors="replace") not in result.stderr
    assert sm.requests == []


def test_the_cli_key_rule_is_the_node_proxys() -> None:
    assert f'KEY_RE = r"{KEY_RE}"' in boot_helper_text()


def test_the_fake_refuses_an_add_version_the_api_would_refuse(
    cli_env: Env, sm: FakeSecretManager,
) -> None:
    import requests

    d = cli_env.d("spot")
    url = f"{sm.endpoint}v1/projects/{PROJECT}/secrets/{d.api_key_secret_id}:addVersion"
    auth = {"Authorization": f"Bearer {cli_env.tpu.token}"}
    data = base64.b64encode(b"x" * 20).decode()
    bad = [{"data": data}, {"payload": {"data": data, "extra": 1}},
           {"payload": {"data": data, "dataCrc32c": str(crc32c(b"y" * 20))}}]
    for body in bad:
        r = requests.post(url, json=body, headers=auth, timeout=5)
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert len(sm.secrets[d.api_key_secret_id]) == 1
