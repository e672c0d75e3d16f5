"""The fleet's proxy config on the real nginx: exactly `GET /metrics` needs no key only from
the allowed source ranges; everything else keeps the VM's rule."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.vllm_routes import Upstream
from tests.ports import free_port
from tests.render.test_proxy_nginx import (
    API_KEY,
    NGINX,
    Proxy,
    layout,
    nginx_argv,
    run_boot_functions,
)
from tpuserve.render.boot_script import render_startup
from tpuserve.render.proxy_conf import render_nginx_conf
from tpuserve.settings import load

pytestmark = pytest.mark.skipif(
    NGINX is None, reason="the nginx binary is absent (Debian: apt-get install -y nginx)")


def start(base: Path, up: Upstream, allow: tuple[str, ...]) -> tuple[Proxy, subprocess.Popen]:
    for sub in ("secrets", "logs", "temp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "raw-key").write_text(API_KEY)
    script = render_startup(load(environ={}).deployments["spot"])
    run_boot_functions(script, f"nginx_key_include {base}/raw-key {base}/secrets/api-key.conf\n")
    port = free_port()
    conf = base / "nginx.conf"
    conf.write_text(render_nginx_conf(public_port=port, backend_port=up.port, tls=False,
                                      layout=layout(base), metrics_allow=allow))
    proc = subprocess.Popen(nginx_argv(base, conf, "-g", "daemon off;"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proxy = Proxy(port, None, up, None, conf)
    for _ in range(500):
        assert proc.poll() is None, (base / "logs/error.log").read_text()
        try:
            if proxy.send("GET", "/health") == 200:
                return proxy, proc
        except OSError:
            pass
        subprocess.run(["sleep", "0.02"], check=True)
    proc.kill()
    raise AssertionError("nginx did not answer")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream().start()
    yield up
    up.stop()


@pytest.mark.parametrize(("allow", "open_metrics"), [(("127.0.0.0/8",), True),
                                                      (("10.96.0.0/14",), False)])
def test_metrics_open_only_from_the_allowed_range(tmp_path_factory, upstream, allow,
                                                  open_metrics) -> None:
    base = tmp_path_factory.mktemp("nginx-fleet")
    base.chmod(0o755)
    proxy, proc = start(base, upstream, allow)
    try:
        # Reaches vLLM (the fake's Starlette mount answers /metrics with its 307 to /metrics/).
        for target in ("/metrics", "/metrics/"):
            assert (proxy.send("GET", target) != 401) is open_metrics, target
        for method, target in [("GET", "/metrics/../v1/models"), ("GET", "/metrics?x"),
                               ("GET", "/metrics/x"),
                               ("POST", "/metrics"), ("HEAD", "/metrics"), ("GET", "//metrics"),
                               ("GET", "/v1/models"), ("POST", "/tokenize")]:
            assert proxy.send(method, target) in (400, 401), (method, target)
        assert proxy.send("GET", "/v1/models", key=API_KEY) == 200
        assert proxy.send("GET", "/health") == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
