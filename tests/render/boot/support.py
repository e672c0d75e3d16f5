"""The harness of tests/render/boot: the rendered boot script, run for real (bash) end to end
against fakes on 127.0.0.1. The tests are split along the script's parts (test_cache.py,
test_secrets.py, ...) so pytest-xdist spreads them; tests sharing one booted node are in
test_booted_node.py (its module fixture builds the node once).


A `Cloud` holds the fakes of one project (metadata server, Secret Manager, Cloud Storage, the
TPU API, and the container registry the fake `docker` pulls from); a `Node` is one TPU VM's
disk: a temp dir as TPUSERVE_ROOT, a fake `docker` and spies on `curl` and `python3` first on
PATH (each call's argv and environment are recorded), and the script rendered from the default
config. TPUSERVE_TIME_SCALE=0.001 turns every wait, backoff and poll into milliseconds. The
fake TPU API is there (and the script pointed at it) to show the node never calls it: the
billing guard lives off the node.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

from tests.fakes.metadata import FakeMetadata, GuestWrite
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.storage import FakeStorage, StorageCall
from tests.fakes.tpu_api import FakeTpuApi
from tests.nginx_support import NGINX
from tests.ports import free_port
from tpuserve.contracts import GUEST_ATTRIBUTE_NAMESPACE
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import CACHE_OBJECT_PREFIX, render_startup, startup_context
from tpuserve.settings import Deployment, load

REPO = REPO_ROOT
FAKE_DOCKER = REPO / "tests" / "fakes" / "docker"
NAMESPACE = GUEST_ATTRIBUTE_NAMESPACE
CREATE_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z, the node's createTime in the fake TPU API
# Phases a full boot records, in order.
BOOT_STORY = [
    "boot", "state", "secret", "tls", "image", "cache", "container", "config", "bypass_check",
    "metrics", "memory", "kv_cache", "startup_complete", "health", "state", "cache_publish",
]
IMAGE = "vllm/vllm-tpu:nightly"  # config/default.toml's vllm.image: a mutable tag
EXTERNAL_IP = "34.1.2.3"  # the booted node's access config, in its certificate
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
# Retry budgets are minutes (a 900 s pull budget is 0.9 s at the default test scale) and every
# attempt costs a process: where calls fail for good, the run goes at a fifth of it.
FAST = {"TPUSERVE_TIME_SCALE": "0.0002"}
# Where a test needs the readiness budget (2400 s: 2.4 s at 0.001) to outlast a few boots on a
# loaded machine (a fake boot takes about a real second, more under load): 24 s.
ROOMY = {"TPUSERVE_TIME_SCALE": "0.01"}



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
            # The proxy container runs Debian's real nginx when it is installed.
            **({"FAKE_DOCKER_NGINX": NGINX} if NGINX else {}),
            **fake_env,
        }

    @property
    def cache_key(self) -> str:
        """The config's part of the compile-cache key (the image digest completes it)."""
        return str(startup_context(self.deployment, backend_port=self.cloud.backend_port)[
            "cache_key"])

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
        """Power off: kill the watcher (and a boot it runs), then the containers' processes
        (state stays)."""
        self.stop_watcher()
        for path in (self.docker_state / "containers").glob("*.json"):
            pid = json.loads(path.read_text()).get("pid", 0)
            if pid:
                _kill_group(pid)

    def reboot(self) -> None:
        """Power off and on up to the boot script: processes die, the tmpfs under /run
        empties (the disk stays), then dockerd starts and restarts the containers it was
        told to (the fake's `__daemon_start__`: emulated from docker's documented behaviour,
        not measured on a node)."""
        self.stop()
        for f in sorted((self.root / "run").rglob("*"), reverse=True):
            if f.is_dir() and not f.is_symlink():
                f.rmdir()
            else:
                f.unlink()
        subprocess.run([str(self.bin / "docker"), "__daemon_start__"], env=self.env,
                       check=True, timeout=30)

    # -- the watcher (boot_helper.py watch): a detached process group under TPUSERVE_ROOT
    @property
    def watch_log(self) -> Path:
        return self.root / "var/log/tpuserve/watch.log"

    def watcher_pids(self) -> list[int]:
        """Live processes running this node's watcher (its python3 `watch` command line)."""
        helper = str(self.root / "var/lib/tpuserve/boot_helper.py")
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and helper.encode() in argv and b"watch" in argv:
                pids.append(int(proc.name))
        return pids

    def stop_watcher(self) -> None:
        """Kill the watcher's process group (setsid: its pid), a boot it runs included."""
        pid_file = self.root / "run/tpuserve/watch.pid"
        pids = set(self.watcher_pids())
        if pid_file.exists():
            pids.add(int(pid_file.read_text()))
        for pid in pids:
            _kill_group(pid)

        # A boot the watcher was re-running may have started a watcher of its own (setsid: a
        # session of its own, out of the group just killed) before it died: kill those too.
        def gone() -> bool:
            alive = self.watcher_pids()
            for pid in alive:
                _kill_group(pid)
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            return not alive

        wait_for(gone, "the watcher to end", timeout=20)

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
    with suppress(ProcessLookupError, PermissionError):
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


def _curl_calls(node: Node, fragment: str) -> list[str]:
    return [line for line in node.spy_log.read_text().splitlines()
            if line.startswith("CALL curl") and fragment in line]


def cache_object(cache_key: str, image_digest: str) -> str:
    """What the script names the bucket object of a compile cache (cache_select): the config's
    key, then the first 12 hex of the image as pulled (`repo@sha256:HEX`, or `sha256:HEX`, the
    image id of a local build). The one place the tests spell it."""
    hex_digest = image_digest.rpartition("@")[2].rpartition(":")[2]
    if not re.fullmatch(r"[0-9a-f]{12,}", hex_digest):
        raise ValueError(f"image digest {image_digest!r}: expected [repo@]sha256:<hex>")
    return f"{CACHE_OBJECT_PREFIX}{cache_key}-{hex_digest[:12]}.tar.gz"
