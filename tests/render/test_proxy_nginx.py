"""The API-key proxy as it runs: the REAL nginx (Debian's package) with the config rendered by
tpuserve/render/proxy_conf.py (the same template the node renders, with a test ProxyLayout), the
key rule and TLS certificate made by the boot script's own functions, in front of an upstream that
routes the way vLLM does (tests/fakes/vllm_routes.py).

Requests are written on raw sockets, so nothing on the client side normalises them. The rule:
without the key, only exactly `GET /health` and `HEAD /health` reach the upstream; with the
key, everything nginx accepts is proxied with its target unchanged; a wrong key is a 401.
"""

from __future__ import annotations

import pwd
import re
import shlex
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.vllm_routes import Upstream
from tests.nginx_support import NGINX
from tests.ports import free_port
from tpuserve.render.boot_script import boot_helper_text, render_startup
from tpuserve.render.proxy_conf import ProxyLayout, render_nginx_conf
from tpuserve.settings import load

pytestmark = pytest.mark.skipif(
    NGINX is None, reason="the nginx binary is absent (Debian: apt-get install -y nginx)")
API_KEY = "tpk-" + "A1b2C3d4E5f6G7h8" * 2
WRONG_KEY = "tpk-" + "Z9y8X7w6V5u4T3s2" * 2

# (method, raw request target). Only the first two are open; every other row probes one way
# of reaching /metrics, /health's neighbours or another route without the key.
OPEN = [("GET", "/health"), ("HEAD", "/health")]
GUARDED = [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
    ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/version"), ("GET", "/"),
    ("GET", "/metrics"), ("GET", "/metrics/"), ("GET", "/metrics/x"), ("GET", "/metricsx"),
    # dot segments, plain and percent-encoded, after and before /health
    ("GET", "/health/../metrics"), ("GET", "/health/./../metrics"),
    ("GET", "/health/%2e%2e/metrics"), ("GET", "/health/%2E%2E/metrics"),
    ("GET", "/health/.%2e/metrics"), ("GET", "/health/..%2fmetrics"),
    ("GET", "/health%2F..%2Fmetrics"), ("GET", "/health%2f%2e%2e%2fmetrics"),
    ("GET", "/v1/../health"), ("GET", "/./health"), ("GET", "/health/."),
    # normalised to /health by nginx, but Starlette's /metrics mount takes the raw path
    ("GET", "/metrics/../health"), ("GET", "/metrics/%2e%2e/health"),
    ("GET", "/metrics/..%2Fhealth"), ("GET", "/metrics%2F..%2Fhealth"),
    ("HEAD", "/metrics/../health"), ("GET", "/tokenize/../health"),
    ("GET", "/%2e%2e/metrics"), ("GET", "/%2e/health"), ("GET", "/../health"),
    # slashes
    ("GET", "//health"), ("GET", "///health"), ("GET", "/health/"), ("GET", "/health//"),
    ("GET", "//metrics"), ("GET", "/%2Fhealth"), ("GET", "/health%2F"),
    # encoded letters, case, NUL, spaces, backslashes, semicolons
    ("GET", "/%68ealth"), ("GET", "/healt%68"), ("GET", "/%6detrics"), ("GET", "/HEALTH"),
    ("GET", "/Health"), ("GET", "/health%00"), ("GET", "/health%20"), ("GET", "/health%0a"),
    ("GET", "/health\\..\\metrics"), ("GET", "/health;/../metrics"), ("GET", "/health;x"),
    # queries, fragments, trailing segments
    ("GET", "/health?"), ("GET", "/health?x"), ("GET", "/health?x=/../metrics"),
    ("GET", "/health#x"), ("GET", "/health/x"), ("GET", "/healthz"), ("GET", "/health.json"),
    # methods on /health
    ("POST", "/health"), ("PUT", "/health"), ("DELETE", "/health"), ("PATCH", "/health"),
    ("OPTIONS", "/health"), ("HEAD", "/metrics"), ("HEAD", "/health/../metrics"),
    # absolute-form targets
    ("GET", "http://localhost/metrics"), ("GET", "http://localhost/health/../metrics"),
    ("GET", "http://localhost//health"),
]
CASES = OPEN + GUARDED


@dataclass
class Proxy:
    port: int
    tls: ssl.SSLContext | None
    upstream: Upstream
    cert_pem: Path | None
    conf: Path

    def send(self, method: str, target: str, *, key: str | None = None,
             probe: str = "", plain: bool = False) -> int:
        """One raw request; the HTTP status nginx answers (0 when it closed without one)."""
        head = [f"{method} {target} HTTP/1.1", "Host: localhost", f"X-Probe: {probe}",
                "Content-Length: 0", "Connection: close"]
        if key:
            head.append(f"Authorization: Bearer {key}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw:
            sock = raw if (self.tls is None or plain) else self.tls.wrap_socket(
                raw, server_hostname="127.0.0.1")
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        m = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
        return int(m[1]) if m else 0


def boot_function(script: str, name: str) -> str:
    """One function of the rendered boot script, verbatim."""
    m = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script, re.MULTILINE | re.DOTALL)
    assert m, f"{name} is not in the boot script"
    return m[0]


def write_helper(folder: Path) -> Path:
    """FOLDER/boot_helper.py: the helper the script carries, as the boot writes it."""
    path = folder / "boot_helper.py"
    path.write_text(boot_helper_text())
    return path


def run_boot_functions(script: str, body: str) -> None:
    """Run the boot script's own nginx_key_include and tls_cert (no metadata server: the
    certificate gets 127.0.0.1 alone; the helper they run is the file the script carries)."""
    with tempfile.TemporaryDirectory() as folder:
        prelude = ("set -euo pipefail\nMETA_HOST=127.0.0.1:9\nlog() { :; }\n"
                   "fail() { echo \"$*\" >&2; exit 1; }\ntmo() { echo 1; }\n"
                   f"HELPER={shlex.quote(str(write_helper(Path(folder))))}\n")
        code = prelude + "".join(boot_function(script, n)
                                 for n in ("nginx_key_include", "tls_cert"))
        subprocess.run(["bash", "-c", code + body], check=True, capture_output=True, text=True)


def worker_user() -> str:
    for user in ("www-data", "nginx", "nobody"):
        try:
            pwd.getpwnam(user)
            return user
        except KeyError:
            continue
    return "nobody"


def layout(base: Path) -> ProxyLayout:
    return ProxyLayout(
        user=worker_user(), key_include=str(base / "secrets/api-key.conf"),
        tls_cert=str(base / "secrets/tls-cert.pem"), tls_key=str(base / "secrets/tls-key.pem"),
        pid=str(base / "nginx.pid"), error_log=str(base / "logs/error.log"),
        access_log=str(base / "logs/access.log"), temp_dir=str(base / "temp"),
    )


def prepare(base: Path, *, tls: bool, backend_port: int) -> tuple[Path, int]:
    """The rendered config and, made by the boot's own functions, the key rule and the
    certificate, under BASE; returns (nginx.conf, public port)."""
    for sub in ("secrets", "logs", "temp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "secrets").chmod(0o700)
    script = render_startup(load(environ={}).deployments["spot"])
    (base / "raw-key").write_text(API_KEY)
    run_boot_functions(script, f"nginx_key_include {base}/raw-key {base}/secrets/api-key.conf\n"
                       + (f"tls_cert {base}/secrets\n" if tls else ""))
    port = free_port()
    conf = base / "nginx.conf"
    conf.write_text(render_nginx_conf(public_port=port, backend_port=backend_port, tls=tls,
                                      layout=layout(base)))
    return conf, port


def nginx_argv(base: Path, conf: Path, *extra: str) -> list[str]:
    assert NGINX is not None
    return [NGINX, "-p", f"{base}/", "-c", str(conf), "-e", str(base / "logs/error.log"), *extra]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream().start()
    yield up
    up.stop()


def start_proxy(base: Path, up: Upstream, *, tls: bool) -> tuple[Proxy, subprocess.Popen[str]]:
    conf, port = prepare(base, tls=tls, backend_port=up.port)
    proc = subprocess.Popen(nginx_argv(base, conf, "-g", "daemon off;"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = None
    if tls:
        ctx = ssl.create_default_context(cafile=base / "secrets/tls-cert.pem")
    proxy = Proxy(port, ctx, up, base / "secrets/tls-cert.pem" if tls else None, conf)
    for _ in range(500):
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"nginx exited {proc.returncode}: {out}"
                                 f"{(base / 'logs/error.log').read_text()}")
        try:
            if proxy.send("GET", "/health", probe="startup") == 200:
                return proxy, proc
        except OSError:
            pass
        subprocess.run(["sleep", "0.02"], check=True)
    proc.kill()
    raise AssertionError(f"nginx did not answer: {(base / 'logs/error.log').read_text()}")


@pytest.fixture(scope="module", params=["tls", "plain"])
def proxy(request: pytest.FixtureRequest, upstream: Upstream,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    base = tmp_path_factory.mktemp(f"nginx-{request.param}")
    base.chmod(0o755)  # the worker user reads nothing here, but may need to traverse
    p, proc = start_proxy(base, upstream, tls=request.param == "tls")
    yield p
    proc.terminate()
    proc.wait(timeout=10)


# ------------------------------------------------------------------ the rendered config
@pytest.mark.parametrize("tls", [True, False])
def test_nginx_accepts_the_rendered_config(tmp_path: Path, tls: bool) -> None:
    conf, _ = prepare(tmp_path, tls=tls, backend_port=free_port())
    proc = subprocess.run(nginx_argv(tmp_path, conf, "-t"), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "test is successful" in proc.stderr


# ------------------------------------------------------------------ the table
def _probe(method: str, target: str, who: str) -> str:
    return f"{who}:{method}:{target}"


@pytest.mark.parametrize(("method", "target"), CASES)
def test_without_the_key_only_get_and_head_of_exactly_health_reach_vllm(
    proxy: Proxy, method: str, target: str,
) -> None:
    for who, key in (("nokey", None), ("wrongkey", WRONG_KEY)):
        probe = _probe(method, target, f"{who}-{proxy.tls is not None}")
        status = proxy.send(method, target, key=key, probe=probe)
        seen = proxy.upstream.recorder.for_probe(probe)
        if (method, target) in OPEN:
            assert status == 200, (who, status)
            assert [(s.method, s.target, s.authorization) for s in seen] == [
                (method, "/health", "")]
        else:
            # 401 from the key rule, or 400 where nginx refuses the request line itself.
            assert status in (400, 401), (who, status)
            assert seen == [], f"{who}: {method} {target} reached the upstream as {seen}"


# nginx itself refuses these request lines (400) whatever the key: a path that climbs above
# the root, a raw backslash or NUL it will not decode, an absolute-form oddity. Found by
# running them; the test below fails if one of them starts passing or another starts failing.
NGINX_REFUSES = {
    ("GET", "/%2e%2e/metrics"), ("GET", "/../health"), ("GET", "/health%00"),
}


@pytest.mark.parametrize(("method", "target"), CASES)
def test_with_the_key_every_request_reaches_vllm_unchanged(
    proxy: Proxy, method: str, target: str,
) -> None:
    probe = _probe(method, target, f"key-{proxy.tls is not None}")
    status = proxy.send(method, target, key=API_KEY, probe=probe)
    seen = proxy.upstream.recorder.for_probe(probe)
    if (method, target) in NGINX_REFUSES:
        assert (status, seen) == (400, [])
        return
    assert status not in (0, 400, 401, 502), status
    assert len(seen) == 1, seen
    # The raw target, as sent (an absolute-form target arrives as its path): the same bytes the
    # key rule judged. vLLM never sees the key.
    sent = re.sub(r"^http://localhost", "", target).removesuffix("?")  # uvicorn drops a bare ?
    assert (seen[0].method, seen[0].target, seen[0].authorization) == (method, sent, "")


# ------------------------------------------------------------------ TLS
@pytest.mark.parametrize("proxy", ["tls"], indirect=True)
def test_the_tls_port_serves_the_boot_certificate_and_no_plain_http(proxy: Proxy) -> None:
    assert proxy.tls is not None and proxy.cert_pem is not None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    published = x509.load_pem_x509_certificate(proxy.cert_pem.read_bytes())
    with (socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw,
          proxy.tls.wrap_socket(raw, server_hostname="127.0.0.1") as conn):
        served = conn.getpeercert(binary_form=True)
        assert conn.version() in ("TLSv1.2", "TLSv1.3")
    assert served == published.public_bytes(serialization.Encoding.DER)
    # Plain HTTP on the TLS port: nginx answers 400 and nothing reaches vLLM.
    status = proxy.send("GET", "/metrics", key=API_KEY, probe="plain-on-tls", plain=True)
    assert status == 400
    assert proxy.upstream.recorder.for_probe("plain-on-tls") == []
    # A client that trusts another certificate refuses this server.
    other = ssl.create_default_context()
    with (socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw,
          pytest.raises(ssl.SSLCertVerificationError)):
        other.wrap_socket(raw, server_hostname="127.0.0.1")


# ------------------------------------------------------------------ the boot's own self-check
def test_the_boot_bypass_check_passes_against_the_real_nginx(proxy: Proxy,
                                                             tmp_path: Path) -> None:
    """The boot script's bypass_check (its probes and expected codes, a wrong key among them)
    run as the boot runs it, with curl, against the real proxy: it must pass, and nothing may
    reach the upstream."""
    script = render_startup(load(environ={}).deployments["spot"])
    probes = re.search(r"^BYPASS_PROBES=\(\n.*?^\)\n", script, re.MULTILINE | re.DOTALL)
    assert probes
    base = f"{'https' if proxy.tls else 'http'}://127.0.0.1:{proxy.port}"
    tls_args = f"--cacert {proxy.cert_pem}" if proxy.cert_pem else ""
    code = ("set -euo pipefail\ntmo() { echo 5; }\nphase() { echo \"phase $*\"; }\n"
            "close_port() { echo \"FAILED: $*\"; exit 1; }\n"
            f"SECRETS_DIR={shlex.quote(str(tmp_path))}\n"
            f"HELPER={shlex.quote(str(write_helper(tmp_path)))}\n"
            f"PROBE_BASE={base}\nPROBE_TLS=({tls_args})\n" + probes[0]
            + boot_function(script, "key_code") + boot_function(script, "bypass_check")
            + "bypass_check\n")
    before = len(proxy.upstream.recorder.seen)
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^phase bypass_check refused count=\d+$", out.stdout, re.MULTILINE)
    assert proxy.upstream.recorder.seen[before:] == []
