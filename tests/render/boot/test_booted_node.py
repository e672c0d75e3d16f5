"""One node's life, booted once for the module (cold, re-run, then the image tag moved): the
story it records, idempotence, secrets, the proxy, TLS and the cache upload."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import socket
import ssl
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.render.boot.support import (
    BOOT_STORY,
    EXTERNAL_IP,
    IMAGE,
    NAMESPACE,
    STAMP,
    Booted,
    _between,
    _curl_calls,
    _get,
    _story,
    _tls,
    open_cloud,
)
from tpuserve.settings.sections import PROXY_IMAGE


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    with open_cloud(tmp_path_factory.mktemp("booted")) as cloud:
        cloud.metadata.external_ip = EXTERNAL_IP
        node = cloud.node()
        lockfile = node.root / "tmp/libtpu_lockfile"  # a killed server's leftover
        lockfile.parent.mkdir(parents=True)
        lockfile.write_text("12345")
        node.run()
        cold_attrs = node.attrs()
        cold_writes = cloud.metadata.writes_in(NAMESPACE)
        cold_custom_time = cloud.custom_time(cloud.cache_object(node))
        rerun_at = time.time()
        node.run()
        rerun_attrs = node.attrs()
        rerun_custom_time = cloud.custom_time(cloud.cache_object(node))
        old_digest = cloud.digest()
        new_digest = cloud.move_tag()  # same config; nightly now names another build
        moved_at = time.time()
        node.run()
        yield Booted(cloud, node, cold_attrs, cold_writes, cold_custom_time,
                     rerun_at, rerun_attrs, rerun_custom_time, old_digest, moved_at, new_digest)


def test_a_cold_boot_restores_nothing_and_publishes_once_after_health(booted: Booted) -> None:
    cloud, node, attrs = booted.cloud, booted.node, booted.cold_attrs
    assert attrs["state"] == "ready"
    object_name = cloud.cache_object(node, booted.old_digest)
    # The key: the config's, then the pulled image's digest.
    assert object_name == f"xla-cache/{node.cache_key}-{booted.old_digest[7:19]}.tar.gz"
    assert attrs["cache"] == f"miss no object gs://{cloud.deployment.cache_bucket}/{object_name}"
    storage = cloud.storage
    assert _between(storage.calls_of("download"), 0, booted.moved_at) == [
        (object_name, 404)]
    # The re-run did not publish again.
    assert _between(storage.calls_of("upload"), 0, booted.moved_at) == [(object_name, 200)]
    health = next(w.at for w in booted.cold_writes if w.key == "health")
    assert storage.calls_of("upload")[0].at > health
    assert re.fullmatch(rf"published object_bytes=\d+ files=6 bytes=\d+ custom_time={STAMP}",
                        attrs["cache_publish"]), attrs["cache_publish"]
    with tarfile.open(fileobj=BytesIO(cloud.storage.objects[object_name].data)) as tar:
        programs = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert programs == [f"./xla_cache/jit_step_{n}-cache" for n in range(6)]


def test_a_published_cache_gets_its_custom_time_after_the_upload(booted: Booted) -> None:
    cloud, node = booted.cloud, booted.node
    object_name = cloud.cache_object(node, booted.old_digest)
    upload = cloud.storage.calls_of("upload")[0]
    patches = cloud.storage.calls_of("patch")
    assert _between(patches, 0, booted.rerun_at) == [(object_name, 200)]
    assert patches[0].at > upload.at
    assert booted.cold_custom_time == booted.cold_attrs["cache_publish"].rsplit("=", 1)[1]
    # The re-run used the cache again: its expiry clock restarted (customTime moved forward).
    assert booted.rerun_custom_time == booted.rerun_attrs["cache_publish"].rsplit("=", 1)[1]
    assert booted.rerun_custom_time > booted.cold_custom_time


def test_the_guest_attributes_tell_the_whole_story(booted: Booted) -> None:
    story = _story(booted.cold_writes)
    assert [k for k, _ in story] == BOOT_STORY
    values = dict(story)
    assert [v for k, v in story if k == "state"] == ["booting", "ready"]
    key_sha = hashlib.sha256(booted.cloud.api_key.encode()).hexdigest()[:12]
    assert values["secret"] == f"fetched api_key_sha256={key_sha}"
    assert values["image"] == \
        f"pulled vllm/vllm-tpu:nightly {PROXY_IMAGE} digest={booted.old_digest}"
    assert values["container"] == "started"
    assert values["memory"] == ("total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.49GiB | "
                                "total_hbm_used_gb=8.97GiB | total_hbm_avail_gb=5.52GiB")
    assert values["kv_cache"] == values["startup_complete"] == "seen"
    assert values["health"] == "ok"
    stamps = [w.value.split(" ", 1)[0] for w in booted.cold_writes]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps)
    assert stamps == sorted(stamps)
    # The documented limit is 10 writes a minute; the script keeps 8 per (scaled) minute.
    times = [w.at for w in booted.cold_writes]
    assert all(b - a > 0.03 for a, b in zip(times, times[8:], strict=False))


def test_a_rerun_is_idempotent_and_keeps_the_healthy_server(booted: Booted) -> None:
    node, since, until = booted.node, booted.rerun_at, booted.moved_at
    assert node.docker_commands("run", since, until) == []
    assert node.docker_commands("rm", since, until) == []
    # Only vLLM's image is pulled again, to learn whether its tag moved.
    assert node.docker_commands("pull", since, until) == [["pull", "-q", IMAGE]]
    attrs = booted.rerun_attrs
    assert attrs["state"] == "ready"
    assert attrs["container"] == "reused"
    assert attrs["image"] == f"pulled {IMAGE} digest={booted.old_digest}"
    assert attrs["cache"].startswith("local files=6")
    assert attrs["cache_publish"].startswith("unchanged files=6")
    assert _between(booted.cloud.storage.calls_of("upload"), since, until) == []
    # Three boots, and not one call to the TPU API: no credential on the node may delete a
    # node, so the node has no reason to call it.
    assert booted.cloud.tpu.calls() == []


def test_a_moved_tag_is_a_new_cache_and_replaces_the_running_server(booted: Booted) -> None:
    cloud, node, moved = booted.cloud, booted.node, booted.moved_at
    new_digest = booted.new_digest
    old_object = cloud.cache_object(node, booted.old_digest)
    new_object = cloud.cache_object(node, new_digest)
    assert new_object != old_object
    attrs = node.attrs()
    bucket = cloud.deployment.cache_bucket
    # The old build's programs are not restored: a miss under the new key, then a cold compile
    # published under it.
    assert attrs["image"] == f"pulled {IMAGE} digest={new_digest}"
    assert attrs["cache"] == f"miss no object gs://{bucket}/{new_object}"
    storage = cloud.storage
    assert _between(storage.calls_of("download"), moved) == [(new_object, 404)]
    assert _between(storage.calls_of("upload"), moved) == [(new_object, 200)]
    assert attrs["cache_publish"].startswith("published ")
    assert attrs["state"] == "ready"
    vllm_log = (node.docker_state / "containers/vllm-gemma4.log").read_text()
    assert "Compiling XLA programs" in vllm_log
    # The running server was replaced (the proxy kept), pinned to the new build.
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", moved)]
    assert started == ["vllm-gemma4"] and attrs["container"] == "started"
    assert node.container("vllm-gemma4")["image"] == f"vllm/vllm-tpu@{new_digest}"
    # Only the new key's cache stays on disk; the old object waits for its lifecycle rule.
    cache_ids = [p.name for p in (node.root / "var/cache/tpuserve/xla").iterdir()]
    assert cache_ids == [f"{node.cache_key}-{new_digest[7:19]}"]
    assert old_object in storage.objects


def test_a_stale_libtpu_lockfile_is_removed_and_the_container_gets_a_fresh_tmp(
    booted: Booted,
) -> None:
    node = booted.node
    assert not (node.root / "tmp/libtpu_lockfile").exists()
    run = node.docker_commands("run")[0]
    assert run[run.index("--tmpfs") + 1] == "/tmp"
    assert run[run.index("--restart") + 1] == "unless-stopped"
    # The image runs pinned to the digest its compile cache was keyed on, not by its tag.
    image_at = run.index("serve") - 2  # ... IMAGE vllm serve MODEL ...
    assert run[image_at] == f"vllm/vllm-tpu@{booted.old_digest}" and IMAGE not in run


def test_secrets_never_leave_the_tmpfs_files(booted: Booted) -> None:
    cloud, node = booted.cloud, booted.node
    spied = node.spy_log.read_text()
    assert "CALL curl" in spied and "CALL python3" in spied and node.docker_calls()
    places = [("script output", node.log()),
              ("guest attributes", json.dumps([w.value for w in cloud.metadata.writes]))]
    secrets_dir = node.root / "run/tpuserve/secrets"
    # The fake docker's view of a file bind mount is a hard link (the same inode): the file.
    tmpfs_inodes = {p.stat().st_ino for p in secrets_dir.iterdir()}
    places += [(str(path), path.read_text(errors="replace"))  # disk, spies, docker calls
               for path in node.root.parent.rglob("*")
               if path.is_file() and secrets_dir not in path.parents
               and path.stat().st_ino not in tmpfs_inodes]
    # The proxy's TLS private key was made on the node: its body is in no log, argv,
    # environment, guest attribute or file outside the tmpfs either.
    tls_key = (secrets_dir / "tls-key.pem").read_text()
    assert "PRIVATE KEY-----" in tls_key
    key_body = "".join(tls_key.strip().splitlines()[1:-1])
    secret_values = {**cloud.secret_values, "TLS private key": key_body}
    places += [("spy log, lines joined", "".join(spied.split()))]
    leaks = [f"{name} in {where}" for name, value in secret_values.items()
             for where, text in places if value in text]
    assert leaks == []
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in secrets_dir.iterdir()) == [
        ".tmpfs", "api-key", "api-key.conf", "hf_token", "tls-cert.pem", "tls-cert.san",
        "tls-key.pem"]
    public = {"tls-cert.pem", "tls-cert.san"}  # the certificate is published on purpose
    for f in secrets_dir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == (0o644 if f.name in public else 0o600), f
    assert (secrets_dir / "hf_token").read_text() == cloud.hf_token  # trailing newline dropped
    assert f'"Bearer {cloud.api_key}"' in (secrets_dir / "api-key.conf").read_text()
    vllm = node.container("vllm-gemma4")
    received = (node.docker_state / "containers/vllm-gemma4.token-sha256").read_text()
    assert received == hashlib.sha256(cloud.hf_token.encode()).hexdigest()
    assert [e for e in vllm["env"] if e.startswith("HF_")] == [
        "HF_HOME=/dev/shm", "HF_TOKEN_PATH=/run/secrets/hf_token"]
    assert f"{secrets_dir}/hf_token:/run/secrets/hf_token:ro" in vllm["volumes"]
    proxy = node.container("tpuserve-proxy")
    assert f"{secrets_dir}/api-key.conf:/etc/nginx/tpuserve/api-key.conf:ro" in proxy["volumes"]
    assert f"{secrets_dir}/tls-key.pem:/etc/nginx/tpuserve/tls-key.pem:ro" in proxy["volumes"]


def test_the_proxy_requires_the_key_on_every_path_but_health(booted: Booted) -> None:
    cloud = booted.cloud
    port, tls = cloud.public_port, _tls(booted.node)
    assert _get(port, "/health", tls=tls) == 200
    for path in ("/v1/models", "/metrics", "/tokenize", "/version", "/", "//health",
                 "/health/../metrics"):
        assert _get(port, path, tls=tls) == 401, path
        assert _get(port, path, "wrong-key-0123456789", tls=tls) == 401, path
    assert _get(port, "/health", method="POST", tls=tls) == 401
    assert _get(port, "/v1/models", cloud.api_key, tls=tls) == 200
    assert _get(port, "/metrics", cloud.api_key, tls=tls) == 200
    # The boot checked the same from inside the node (BYPASS_PROBES), and said so.
    assert re.fullmatch(r"refused count=\d+", booted.cold_attrs["bypass_check"])
    cmd = booted.node.container("vllm-gemma4")["cmd"]
    assert cmd[-4:] == ["--host", "127.0.0.1", "--port", str(cloud.backend_port)]


def test_the_proxy_serves_tls_with_a_certificate_made_on_the_node(booted: Booted) -> None:

    node, port = booted.node, booted.cloud.public_port
    secrets_dir = node.root / "run/tpuserve/secrets"
    fingerprint, cert_b64 = re.fullmatch(r"sha256=([0-9a-f]{64}) cert=(\S+)",
                                         booted.cold_attrs["tls"]).groups()
    der = base64.b64decode(cert_b64, validate=True)
    assert hashlib.sha256(der).hexdigest() == fingerprint
    cert = x509.load_pem_x509_certificate((secrets_dir / "tls-cert.pem").read_bytes())
    assert cert.public_bytes(serialization.Encoding.DER) == der  # the published one is served
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1", EXTERNAL_IP}
    # openssl made the key into the tmpfs: only paths in its argv.
    calls = [line for line in node.spy_log.read_text().splitlines()
             if line.startswith("CALL openssl req")]
    assert len(calls) == 1 and f"-keyout {secrets_dir}/tls-key.pem.new" in calls[0]
    # Re-runs keep the certificate while it is valid: clients' pins stay good.
    assert booted.rerun_attrs["tls"] == booted.cold_attrs["tls"]
    # The served certificate is the published one; another one is refused; no plain HTTP.
    with (socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
          _tls(node).wrap_socket(raw, server_hostname="127.0.0.1") as conn):
        assert conn.getpeercert(binary_form=True) == der
    other = booted.cloud.base / "other-cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=tpuserve",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "/dev/null",
                    "-out", str(other)], check=True, capture_output=True)
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(port, "/health", tls=ssl.create_default_context(cafile=other))
    try:
        plain: int | None = _get(port, "/health")
    except (OSError, http.client.HTTPException):
        plain = None
    assert plain in (None, 400)  # nginx answers plain HTTP on its TLS port with its own 400


def test_the_cache_upload_is_a_resumable_upload_streamed_from_disk(booted: Booted) -> None:
    cloud, node = booted.cloud, booted.node
    name = cloud.cache_object(node, booted.old_digest)
    # Two publishes: the cold boot's, and the one after the tag moved (a new object).
    opened = [c for c in _curl_calls(node, "uploadType=resumable") if "upload_id=" not in c]
    assert len(opened) == 2
    # A cold boot may only create the object: it restored no generation.
    assert f"name={name.replace('/', '%2F')}\\&ifGenerationMatch=0" in opened[0]  # %q escapes &
    assert "--data-binary @" not in "".join(_curl_calls(node, "upload/storage"))
    puts = _curl_calls(node, "upload_id=")
    assert len(puts) == 2
    for put in puts:
        assert " -T " in put and "publish.tar.gz" in put and "Content-Range:\\ bytes\\ 0-" in put
    sessions = [c for c in cloud.storage.calls_of("upload_session") if c.at < booted.moved_at]
    assert [(c.method, c.name, c.status) for c in sessions] == [("POST", name, 200)]
