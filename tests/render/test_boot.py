"""The rendered boot script, run for real (bash) end to end against fakes on 127.0.0.1.

A `Cloud` holds the fakes of one project (metadata server, Secret Manager, Cloud Storage, the
TPU API, and the container registry the fake `docker` pulls from); a `Node` is one TPU VM's
disk: a temp dir as TPUSERVE_ROOT, a fake `docker` and spies on `curl` and `python3` first on
PATH (each call's argv and environment are recorded), and the script rendered from the default
config. TPUSERVE_TIME_SCALE=0.001 turns every wait, backoff and poll into milliseconds. The
fake TPU API is there (and the script pointed at it) to show the node never calls it: the
billing guard lives off the node.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.fakes.metadata import FakeMetadata, GuestWrite
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.storage import FakeStorage, StorageCall
from tests.fakes.tpu_api import FakeTpuApi
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import cache_object, render_startup, vllm_command
from tpuserve.render.vllm_args import compile_cache_key
from tpuserve.settings import Deployment, load

REPO = REPO_ROOT
FAKE_DOCKER = REPO / "tests" / "fakes" / "docker"
NAMESPACE = "tpuserve"
CREATE_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z, the node's createTime in the fake TPU API
# Phases a full boot records, in order.
BOOT_STORY = [
    "boot", "state", "secret", "tls", "image", "cache", "container", "memory", "kv_cache",
    "startup_complete", "health", "bypass_check", "state", "cache_publish",
]
IMAGE = "vllm/vllm-tpu:nightly"  # config/default.toml's vllm.image: a mutable tag
EXTERNAL_IP = "34.1.2.3"  # the booted node's access config, in its certificate
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
# Retry budgets are minutes (a 900 s pull budget is 0.9 s at the default test scale) and every
# attempt costs a process: where calls fail for good, the run goes at a fifth of it.
FAST = {"TPUSERVE_TIME_SCALE": "0.0002"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cloud:
    """The fakes of one project, and the secrets they hold."""

    deployment: Deployment
    access_token: str
    hf_token: str
    api_key: str
    metadata: FakeMetadata
    secrets: FakeSecretManager
    storage: FakeStorage
    tpu: FakeTpuApi
    public_port: int
    backend_port: int
    base: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def registry(self) -> Path:
        """The container registry every node's fake docker pulls from: {tag: digest}."""
        return self.base / "registry.json"

    @property
    def secret_values(self) -> dict[str, str]:
        return {"access token": self.access_token, "HF token": self.hf_token,
                "API key": self.api_key}

    def node(self, deployment: Deployment | None = None, **fake_env: str) -> Node:
        """A new TPU VM: an empty disk, fresh guest attributes."""
        self.metadata.guest_attributes.clear()
        self.metadata.writes.clear()
        d = (deployment or self.deployment)
        d = d.model_copy(update={"vllm": d.vllm.model_copy(update={"port": self.public_port})})
        node = Node(self, d, self.base / f"node{len(self.nodes)}", fake_env)
        self.nodes.append(node)
        return node

    def digest(self, ref: str = IMAGE) -> str:
        """The manifest digest the registry serves for REF now (the fake docker's rule)."""
        moved = json.loads(self.registry.read_text()) if self.registry.exists() else {}
        return moved.get(ref) or "sha256:" + hashlib.sha256(ref.encode()).hexdigest()

    def move_tag(self, ref: str = IMAGE) -> str:
        """Push a new build under REF (nightly moves): returns its digest."""
        digest = "sha256:" + hashlib.sha256(f"{self.digest(ref)} next".encode()).hexdigest()
        moved = json.loads(self.registry.read_text()) if self.registry.exists() else {}
        self.registry.write_text(json.dumps({**moved, ref: digest}))
        return digest

    def cache_object(self, node: Node, digest: str | None = None) -> str:
        """The bucket object of NODE's compile cache for DIGEST (the registry's current one)."""
        return cache_object(node.cache_key, digest or self.digest())

    def custom_time(self, name: str) -> str | None:
        return self.storage.objects[name].custom_time


class Node:
    def __init__(self, cloud: Cloud, d: Deployment, base: Path, fake_env: dict[str, str]) -> None:
        self.cloud = cloud
        self.deployment = d
        self.root = base / "root"
        self.bin = base / "bin"
        self.docker_state = base / "docker"
        self.spy_log = base / "spy.log"
        self.script = base / "startup.sh"
        self.outputs: list[str] = []
        for p in (self.root, self.bin, self.docker_state):
            p.mkdir(parents=True)
        self.script.write_text(render_startup(d, backend_port=cloud.backend_port))
        self._install_tools()
        self.env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(self.root / "root"),
            "LANG": "C.UTF-8",
            "TPUSERVE_ROOT": str(self.root),
            "TPUSERVE_TIME_SCALE": "0.001",
            "GCE_METADATA_HOST": cloud.metadata.host,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": cloud.secrets.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": cloud.storage.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": cloud.tpu.url,
            "FAKE_DOCKER_STATE": str(self.docker_state),
            "FAKE_DOCKER_REGISTRY": str(cloud.registry),
            "SPY_LOG": str(self.spy_log),
            "FAKE_VLLM_STEP": "0.01",
            "FAKE_VLLM_COMPILE": "0.05",
            **fake_env,
        }

    @property
    def cache_key(self) -> str:
        """The config's part of the compile-cache key (the image digest completes it)."""
        argv = vllm_command(self.deployment, backend_port=self.cloud.backend_port)
        return compile_cache_key(self.deployment, argv)

    def _install_tools(self) -> None:
        # -S -I: no site-packages. The fake docker and the script's python3 snippets need only
        # the standard library (a TPU VM's stock python3), and start ~30% faster.
        docker = self.bin / "docker"
        docker.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I {FAKE_DOCKER} "$@"\n')
        for tool, real in (("curl", "/usr/bin/curl"), ("python3", f"{sys.executable} -S -I"),
                           ("openssl", "/usr/bin/openssl")):
            spy = self.bin / tool
            # Builtins only (declare -px lists the exported environment): no extra processes.
            spy.write_text(
                "#!/bin/bash\n"
                f"{{ printf 'CALL {tool}'; printf ' %q' \"$@\"; printf '\\n'; declare -px; }}"
                ' >>"$SPY_LOG"\n'
                f'exec {real} "$@"\n'
            )
        for f in self.bin.iterdir():
            f.chmod(0o755)

    # -- running
    def run(self, *, expect_rc: int = 0, timeout: float = 60) -> str:
        proc = subprocess.run(
            ["bash", str(self.script)], env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
        self.outputs.append(proc.stdout + proc.stderr)
        assert proc.returncode == expect_rc, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(self.script)], env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )

    def stop(self) -> None:
        """Power off: kill the containers' processes (state stays)."""
        for path in (self.docker_state / "containers").glob("*.json"):
            pid = json.loads(path.read_text()).get("pid", 0)
            if pid:
                _kill_group(pid)

    # -- observations
    def docker_calls(self) -> list[dict]:
        path = self.docker_state / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def docker_commands(self, verb: str, since: float = 0, until: float = 1e12,
                        ) -> list[list[str]]:
        out = []
        for call in self.docker_calls():
            argv = call["argv"]
            if argv[:1] == ["container"]:
                argv = argv[1:]
            if argv[:1] == [verb] and since <= call["at"] < until:
                out.append(call["argv"])
        return out

    def run_time(self, name: str) -> float:
        """When `docker run` of container NAME was called."""
        for call in self.docker_calls():
            if call["argv"][:1] == ["run"] and name in call["argv"]:
                return call["at"]
        raise AssertionError(f"no docker run of {name}")

    def container(self, name: str) -> dict:
        return json.loads((self.docker_state / "containers" / f"{name}.json").read_text())

    def attrs(self) -> dict[str, str]:
        """tpuserve/* guest attributes without their timestamps."""
        return {k: v.split(" ", 1)[1] if " " in v else "" for k, v in
                self.cloud.metadata.namespace(NAMESPACE).items()}

    def log(self) -> str:
        return "\n".join(self.outputs)


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def archive(files: dict[str, bytes]) -> bytes:
    buf = BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, BytesIO(data))
    return buf.getvalue()


@contextmanager
def open_cloud(base: Path) -> Iterator[Cloud]:
    """The fakes of one project with its two secrets; every node stopped on exit."""
    d = load(environ={}).deployments["spot"]
    token, hf, key = ("ya29.fake-" + os.urandom(12).hex(), "hf_" + os.urandom(16).hex(),
                      "tpk-" + os.urandom(20).hex())
    metadata = FakeMetadata(access_token=token).start()
    secrets = FakeSecretManager(project=d.gcp.project, access_token=token).start()
    storage = FakeStorage(bucket=d.cache_bucket, access_token=token).start()
    tpu = FakeTpuApi(token=token, clock=lambda: CREATE_TIME).start()
    tpu.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    secrets.add_version(d.hf_token_secret_id, (hf + "\n").encode())
    secrets.add_version(d.api_key_secret_id, key.encode())
    c = Cloud(d, token, hf, key, metadata, secrets, storage, tpu, free_port(), free_port(), base)
    try:
        yield c
    finally:
        for node in c.nodes:
            node.stop()
        for server in (metadata, secrets, storage, tpu):
            server.stop()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    with open_cloud(tmp_path) as c:
        yield c


@dataclass
class Booted:
    """One node's life, shared by the read-only tests: booted cold, the script run again, then
    the image tag moved (a new nightly) and the script run a third time."""

    cloud: Cloud
    node: Node
    cold_attrs: dict[str, str]
    cold_writes: list[GuestWrite]
    cold_custom_time: str | None
    rerun_at: float
    rerun_attrs: dict[str, str]
    rerun_custom_time: str | None
    old_digest: str
    moved_at: float
    new_digest: str


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


def _between(calls: list[StorageCall], start: float, end: float = 1e12,
             ) -> list[tuple[str, int]]:
    """(object, HTTP status) of the storage calls made in [start, end)."""
    return [(c.name, c.status) for c in calls if start <= c.at < end]


def _story(writes: list[GuestWrite]) -> list[tuple[str, str]]:
    """(key, value without its timestamp) in write order."""
    return [(w.key, w.value.split(" ", 1)[1]) for w in writes]


def _tls(node: Node) -> ssl.SSLContext:
    """A client context trusting only the certificate NODE made for its proxy."""
    return ssl.create_default_context(cafile=node.root / "run/tpuserve/secrets/tls-cert.pem")


def _get(port: int, path: str, key: str | None = None, *, tls: ssl.SSLContext | None = None,
         method: str = "GET") -> int:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=tls) if tls
            else http.client.HTTPConnection("127.0.0.1", port, timeout=5))
    conn.request(method, path, headers={"Authorization": f"Bearer {key}"} if key else {})
    status = conn.getresponse().status
    conn.close()
    return status


# ------------------------------------------------------------------ cold boot, story, re-run
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
    assert values["secret"] == "fetched"
    assert values["image"] == \
        f"pulled vllm/vllm-tpu:nightly nginx:1.27.3-alpine digest={booted.old_digest}"
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
    # node (issue 10 section 3), so the node has no reason to call it.
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


# ------------------------------------------------------------------ secrets and the proxy
def test_secrets_never_leave_the_tmpfs_files(booted: Booted) -> None:
    cloud, node = booted.cloud, booted.node
    spied = node.spy_log.read_text()
    assert "CALL curl" in spied and "CALL python3" in spied and node.docker_calls()
    places = [("script output", node.log()),
              ("guest attributes", json.dumps([w.value for w in cloud.metadata.writes]))]
    secrets_dir = node.root / "run/tpuserve/secrets"
    places += [(str(path), path.read_text(errors="replace"))  # disk, spies, docker calls
               for path in node.root.parent.rglob("*")
               if path.is_file() and secrets_dir not in path.parents]
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
        "api-key", "api-key.conf", "hf_token", "tls-cert.pem", "tls-cert.san", "tls-key.pem"]
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
    from cryptography import x509

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
    with pytest.raises((OSError, http.client.HTTPException)):
        _get(port, "/health")


def test_tls_off_serves_plain_http_and_publishes_so(cloud: Cloud) -> None:
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={
        "access": d.access.model_copy(update={"tls": "off"}),
        "stack": d.stack.model_copy(update={"max_run_hours": 0}),
    }))
    node.run()
    attrs = node.attrs()
    assert attrs["tls"] == "off" and attrs["state"] == "ready"
    assert attrs["bypass_check"].startswith("refused count=")
    assert not list((node.root / "run/tpuserve/secrets").glob("tls-*"))
    assert _get(cloud.public_port, "/v1/models") == 401
    assert _get(cloud.public_port, "/v1/models", cloud.api_key) == 200
    assert "CALL openssl" not in node.spy_log.read_text()


def test_without_proxy_and_guard_vllm_listens_publicly(cloud: Cloud) -> None:
    d = cloud.deployment
    d = d.model_copy(update={
        "access": d.access.model_copy(update={"api_key_proxy": False}),
        "stack": d.stack.model_copy(update={"max_run_hours": 0}),
    })
    node = cloud.node(d)
    out = node.run()
    assert node.attrs()["state"] == "ready"
    assert not (node.docker_state / "containers/tpuserve-proxy.json").exists()
    assert node.container("vllm-gemma4")["cmd"][-4:] == [
        "--host", "0.0.0.0", "--port", str(cloud.public_port)]
    assert cloud.secrets.calls_for(d.api_key_secret_id) == []
    assert _get(cloud.public_port, "/v1/models") == 200  # the user's own gateway guards it
    assert "guard" not in out
    assert cloud.tpu.calls() == []


def test_an_api_key_that_is_not_a_token_fails_the_boot_without_showing_it(cloud: Cloud) -> None:
    cloud.api_key = 'bad "key" with spaces; return 200'
    cloud.secrets.add_version(cloud.deployment.api_key_secret_id, cloud.api_key.encode())
    node = cloud.node()
    out = node.run(expect_rc=1)
    assert node.attrs()["state"].startswith("failed secret tpuserve-spot-api-key is not a usable")
    assert "openssl rand -base64 32" in out
    assert cloud.api_key not in out
    assert node.docker_commands("run") == []


def test_a_boot_goes_on_when_guest_attributes_are_disabled(cloud: Cloud) -> None:
    cloud.metadata.guest_attributes_enabled = False  # GCE's default without the metadata key
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={"stack": d.stack.model_copy(
        update={"max_run_hours": 0})}))
    out = node.run()
    assert out.count("guest attributes unavailable (HTTP 403;") == 1
    assert "state: ready" in out and "cache_publish: published" in out
    assert cloud.metadata.guest_attributes == {}


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


# ------------------------------------------------------------------ the compile cache
def test_a_warm_boot_on_a_new_node_restores_before_start_and_does_not_publish(
    cloud: Cloud,
) -> None:
    first = cloud.node()
    first.run()
    first.stop()
    object_name = cloud.cache_object(first)
    published = cloud.storage.objects[object_name].generation
    published_custom_time = cloud.custom_time(object_name)

    node = cloud.node()  # a new node (preemption, recreate): empty disk, same bucket
    node.run()
    attrs = node.attrs()
    assert re.fullmatch(r"hit object_bytes=\d+ files=6 bytes=\d+", attrs["cache"])
    hits = [c for c in cloud.storage.calls_of("download") if c.status == 200]
    assert len(hits) == 1 and hits[0].at < node.run_time("vllm-gemma4")
    vllm_log = (node.docker_state / "containers/vllm-gemma4.log").read_text()
    assert "Loaded 6 compiled programs" in vllm_log
    touched = cloud.custom_time(object_name)
    assert attrs["cache_publish"] == \
        f"unchanged {attrs['cache'].split(' ', 2)[2]} custom_time={touched}"
    assert len(cloud.storage.calls_of("upload")) == 1  # the first node's only
    assert cloud.storage.objects[object_name].generation == published
    # The hit restarted the object's expiry clock, once /health answered.
    [patch] = [c for c in cloud.storage.calls_of("patch") if c.at > hits[0].at]
    health = next(w.at for w in cloud.metadata.writes_in(NAMESPACE) if w.key == "health")
    assert patch.name == object_name and patch.status == 200 and patch.at > health
    assert touched > published_custom_time


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "not a tar"])
def test_a_damaged_cache_object_is_a_miss_and_the_boot_goes_on(cloud: Cloud, damage: str) -> None:
    node = cloud.node()
    good = archive({"xla_cache/jit_a-cache": os.urandom(4096)})
    data = {
        "corrupt": os.urandom(3000),
        "truncated": good[: len(good) // 2],
        "not a tar": gzip.compress(b"plain text, not an archive"),
    }[damage]
    cloud.storage.put(cloud.cache_object(node), data)
    node.run()
    attrs = node.attrs()
    reason = {"corrupt": "corrupt or partial object", "truncated": "corrupt or partial object",
              "not a tar": "is not a tar archive of the cache"}[damage]
    assert attrs["cache"].startswith("miss ") and reason in attrs["cache"], attrs["cache"]
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith("published")  # the cold compile replaced it
    stored = cloud.storage.objects[cloud.cache_object(node)]
    with tarfile.open(fileobj=BytesIO(stored.data)) as tar:
        assert len(tar.getmembers()) > 6
    assert stored.custom_time is not None  # the new generation started without one


def test_a_storage_outage_is_a_miss(cloud: Cloud) -> None:
    cloud.storage.outage = True
    node = cloud.node(**FAST)  # the upload's 600 s retry budget
    node.run()
    attrs = node.attrs()
    assert attrs["cache"] == "miss storage answered HTTP 503"
    assert attrs["state"] == "ready"
    # Nothing in the bucket to keep alive: no customTime to set.
    assert attrs["cache_publish"] == "failed upload: HTTP 503 backendError"
    assert len(cloud.storage.calls_of("other")) > 2  # retried with backoff, then gave up


def test_a_storage_timeout_is_a_miss_and_the_boot_goes_on(cloud: Cloud) -> None:
    cloud.storage.download_delay = 1.3  # beyond the 1 s floor of every scaled timeout
    node = cloud.node()
    node.run()
    attrs = node.attrs()
    assert attrs["cache"].startswith("miss download stalled or timed out (under 1048576 B/s")
    assert len(cloud.storage.calls_of("download")) == 1  # a timeout is a miss, not retried
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith("published")


def test_a_stalled_download_is_abandoned_as_a_miss_and_the_publish_replaces_that_generation(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    name = cloud.cache_object(node)
    cloud.storage.put(name, archive({"xla_cache/jit_a-cache": os.urandom(256 * 1024)}))
    stalled_generation = cloud.storage.objects[name].generation
    cloud.storage.download_stall = 30  # half the bytes, then nothing: far beyond the window
    out = node.run()
    attrs = node.attrs()
    assert attrs["cache"].startswith("miss download stalled or timed out"), attrs["cache"]
    assert len(cloud.storage.calls_of("download")) == 1  # a stall is not waited out again
    assert attrs["state"] == "ready"
    # The boot knew which generation it failed to read, and published over exactly that one.
    assert attrs["cache_publish"].startswith("published ")
    assert cloud.storage.objects[name].generation > stalled_generation
    assert "cache: cache:" not in out and "cache: miss download stalled" in out


def test_transient_faults_of_every_google_api_the_boot_calls_are_retried(cloud: Cloud) -> None:
    d = cloud.deployment
    first = cloud.node()
    first.run()  # publishes the cache the next node restores
    first.stop()
    node = cloud.node()
    cloud.secrets.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded", retry_after="2")
    cloud.secrets.faults.html(lambda r: ":access" in r.path, 502)
    cloud.secrets.faults.drop(lambda r: ":access" in r.path)
    cloud.metadata.faults.drop(lambda r: r.path.endswith("/service-accounts/default/token"))
    cloud.storage.fail_next(503, kind="download", retry_after="1")
    cloud.storage.fail_next(0, kind="download", drop=True)
    since = time.time()
    node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["secret"] == "fetched"
    assert attrs["cache"].startswith("hit "), attrs["cache"]
    statuses = [c.status for c in cloud.secrets.calls_for(d.hf_token_secret_id)
                if c.at >= since]
    assert statuses[:4] == [429, 502, 500, 200]  # 500: the dropped one, as recorded
    downloads = [c.status for c in cloud.storage.calls_of("download") if c.at >= since]
    assert downloads == [503, 500, 200]


def _curl_calls(node: Node, fragment: str) -> list[str]:
    return [line for line in node.spy_log.read_text().splitlines()
            if line.startswith("CALL curl") and fragment in line]


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


def test_a_node_never_replaces_a_cache_another_node_published_meanwhile(cloud: Cloud) -> None:
    node = cloud.node()
    name = cloud.cache_object(node)
    theirs = archive({"xla_cache/jit_theirs-cache": b"compiled elsewhere"})
    # Another node finishes its publish just before this one's upload is finalized.
    cloud.storage.before_finalize.append(lambda: cloud.storage.put(name, theirs))
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith(
        f"superseded another node published gs://{cloud.deployment.cache_bucket}/{name} "
        "meanwhile custom_time="), attrs["cache_publish"]
    assert cloud.storage.objects[name].data == theirs  # kept, not silently replaced
    assert [c.status for c in cloud.storage.calls_of("upload")] == [412]
    assert "(another node published meanwhile): kept theirs, not replaced" in out


def test_a_failed_upload_reads_as_one_clean_guest_attribute(cloud: Cloud) -> None:
    # The front end's HTML page (no JSON error, no status word) on every upload try.
    cloud.storage.fail_next(502, kind="upload_session", times=10_000, html=True)
    node = cloud.node()
    node.run()
    attrs = node.attrs()
    assert attrs["cache_publish"] == "failed upload: HTTP 502"  # no trailing space
    assert len(cloud.storage.calls_of("upload_session")) > 1  # retried, then given up


def _storage_patch(storage: FakeStorage, name: str, body: object,
                   content_type: str = "application/json") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", storage.server.port, timeout=5)
    path = f"/storage/v1/b/{storage.bucket}/o/{name.replace('/', '%2F')}"
    conn.request("PATCH", path, json.dumps(body), {
        "Authorization": f"Bearer {storage.access_token}", "Content-Type": content_type})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    return resp.status, answer


def test_the_fake_storage_patches_custom_time_as_documented(cloud: Cloud) -> None:
    storage, name = cloud.storage, "xla-cache/k-0123456789ab.tar.gz"
    assert _storage_patch(storage, name, {"customTime": "2030-01-01T00:00:00Z"})[0] == 404
    storage.put(name, b"x")
    status, resource = _storage_patch(storage, name, {"customTime": "2030-01-01T00:00:00.5Z"})
    assert status == 200 and resource["customTime"] == "2030-01-01T00:00:00.5Z"
    assert resource["metageneration"] == "2"
    refused = [
        ({"customTime": "2029-12-31T23:59:59Z"}, "application/json"),  # moves backwards
        ({"customTime": None}, "application/json"),  # removes it
        ({"customTime": "2030-01-02"}, "application/json"),  # not an RFC 3339 date-time
        ({"custom_time": "2031-01-01T00:00:00Z"}, "application/json"),  # unknown field
        ({"contentType": "text/plain"}, "application/json"),  # not supported by the fake
        ({"customTime": "2031-01-01T00:00:00Z"}, "application/x-www-form-urlencoded"),
    ]
    for body, content_type in refused:
        status, answer = _storage_patch(storage, name, body, content_type)
        assert status == 400 and answer["error"]["code"] == 400, body
        assert answer["error"]["errors"][0]["reason"] in ("invalid", "parseError")
    assert storage.objects[name].custom_time == "2030-01-01T00:00:00.5Z"
    storage.put(name, b"y")  # a new generation starts without one
    assert storage.objects[name].custom_time is None


def _storage_call(storage: FakeStorage, method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", storage.server.port, timeout=5)
    conn.request(method, path, body, {"Authorization": f"Bearer {storage.access_token}",
                                      **(headers or {})})
    resp = conn.getresponse()
    answer = (resp.status, dict(resp.getheaders()), resp.read())
    conn.close()
    return answer


def test_the_fake_storage_speaks_the_resumable_upload_protocol(cloud: Cloud) -> None:
    storage, name = cloud.storage, "xla-cache/k-0123456789ab.tar.gz"
    base = f"/upload/storage/v1/b/{storage.bucket}/o"
    opened = f"{base}?uploadType=resumable&name={name.replace('/', '%2F')}&ifGenerationMatch=0"
    status, headers, _ = _storage_call(storage, "POST", opened, b"{}",
                                       {"Content-Type": "application/json"})
    assert status == 200
    session = headers["Location"].split(str(storage.server.port), 1)[1]
    assert "upload_id=" in session
    # Chunks must continue where the last one ended; a short one is refused.
    assert _storage_call(storage, "PUT", session, b"abc",
                         {"Content-Range": "bytes 1-3/6"})[0] == 400
    status, headers, _ = _storage_call(storage, "PUT", session, b"abc",
                                       {"Content-Range": "bytes 0-2/*"})
    assert status == 308 and headers["Range"] == "bytes=0-2"
    assert _storage_call(storage, "PUT", session, b"",
                         {"Content-Range": "bytes */*"})[0] == 308
    # Another writer creates the object meanwhile: ifGenerationMatch=0 no longer holds.
    storage.put(name, b"theirs")
    status, _, body = _storage_call(storage, "PUT", session, b"def",
                                    {"Content-Range": "bytes 3-5/6"})
    assert status == 412 and json.loads(body)["error"]["errors"][0]["reason"] == "conditionNotMet"
    assert storage.objects[name].data == b"theirs"
    # Over the live generation, it is accepted.
    generation = storage.objects[name].generation
    status, headers, _ = _storage_call(
        storage, "POST", f"{base}?uploadType=resumable&name={name}&ifGenerationMatch={generation}")
    session = headers["Location"].split(str(storage.server.port), 1)[1]
    status, _, body = _storage_call(storage, "PUT", session, b"mine")
    assert status == 200 and json.loads(body)["generation"] == str(generation + 1)
    # Shapes the real API refuses.
    assert _storage_call(storage, "PUT", f"{base}?uploadType=resumable&upload_id=nope", b"x",
                         )[0] == 404
    assert _storage_call(storage, "POST", f"{base}?name={name}", b"x",
                         {"Content-Type": "application/gzip"})[0] == 400  # no uploadType
    assert _storage_call(storage, "POST", f"{base}?uploadType=resumable&name={name}"
                         "&ifGenerationMatch=1", b"")[0] == 412
    assert _storage_call(storage, "POST", f"{base}?uploadType=resumable&name={name}", b"[1]",
                         {"Content-Type": "application/json"})[0] == 400


# ------------------------------------------------------------------ restart hygiene
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
    assert sorted(removed) == sorted(started) == ["tpuserve-proxy", "vllm-gemma4"]
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["container"] == "started"
    assert attrs["cache"].startswith("local files=6")  # the disk kept the compile cache
    assert len(cloud.storage.calls_of("download")) == 1  # only the first boot's miss
    assert attrs["cache_publish"].endswith(" custom_time=failed HTTP 400 invalid")
    assert "could not set customTime of gs://" in out
    assert cloud.custom_time(cloud.cache_object(node)) == later


def test_image_pulls_are_retried_and_a_local_build_is_a_fallback_keyed_on_its_id(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    (node.docker_state / "pull_failures").write_text("2")
    node.run()
    assert len(node.docker_commands("pull")) == 4  # 2 failures, then vllm and nginx
    assert node.attrs()["image"] == \
        f"pulled vllm/vllm-tpu:nightly nginx:1.27.3-alpine digest={cloud.digest()}"

    node.stop()
    (node.root / "run/tpuserve/secrets/hf_token").unlink()  # as after a reboot: start afresh
    (node.docker_state / "pull_failures").write_text("100000")
    # The local copy is a build of its own (docker build -t): no repo digest, only an id.
    images_file = node.docker_state / "images.json"
    images = json.loads(images_file.read_text())
    image_id = "sha256:" + hashlib.sha256(b"a local build").hexdigest()
    images[IMAGE] = {"Id": image_id, "RepoTags": [IMAGE], "RepoDigests": []}
    images_file.write_text(json.dumps(images))
    node.env.update(FAST)
    out = node.run()
    attrs = node.attrs()
    assert attrs["image"] == \
        f"local vllm/vllm-tpu:nightly nginx:1.27.3-alpine id={image_id} (no repo digest)"
    assert f"has no repo digest (built locally?): keying the compile cache on its id {image_id}" \
        in out
    assert attrs["state"] == "ready"
    assert node.container("vllm-gemma4")["image"] == image_id
    # Another build, another cache: nothing restored from the pulled build's object.
    own_object = cache_object(node.cache_key, image_id)
    assert attrs["cache"] == f"miss no object gs://{cloud.deployment.cache_bucket}/{own_object}"
    assert own_object in cloud.storage.objects


def test_an_image_that_cannot_be_pulled_fails_the_boot(cloud: Cloud) -> None:
    node = cloud.node(**FAST)
    (node.docker_state / "pull_failures").write_text("100000")
    node.run(expect_rc=1)
    assert node.attrs()["state"] == "failed could not pull vllm/vllm-tpu:nightly"


def test_a_server_that_dies_ends_failed_with_the_reason(cloud: Cloud) -> None:
    node = cloud.node(FAKE_VLLM_CRASH="1")
    node.run(expect_rc=1)
    attrs = node.attrs()
    assert attrs["state"].startswith("failed vLLM exited: ERROR [core.py] "
                                     "RuntimeProgramAllocationFailure")
    assert "memory" in attrs and "health" not in attrs and "cache_publish" not in attrs
def test_a_key_rule_left_by_an_older_script_is_rewritten_on_the_next_run(cloud: Cloud) -> None:
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={"stack": d.stack.model_copy(
        update={"max_run_hours": 0})}))
    node.run()
    rule = node.root / "run/tpuserve/secrets/api-key.conf"
    # The format before the raw-target rule: it answered 401 on /health too.
    rule.write_text(f'if ($http_authorization != "Bearer {cloud.api_key}") {{\n'
                    '    return 401;\n}\n')
    since = time.time()
    node.run()
    assert '= "Bearer ' in rule.read_text() and "set $tpuserve_pass 1;" in rule.read_text()
    started = [argv[argv.index("--name") + 1] for argv in node.docker_commands("run", since)]
    assert started == ["tpuserve-proxy"]  # a new rule is a new proxy; vLLM keeps serving
    assert _get(cloud.public_port, "/health", tls=_tls(node)) == 200
