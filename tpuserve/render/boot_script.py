"""Renders the boot script from a Deployment. Pure: config in, text out.

One script on the node, authored in parts: templates/boot/startup.sh.j2 (the header and the
settings block, the only place a config value lands) includes lib, api, secrets, proxy, cache,
containers, metrics, readiness and main (templates/boot/*.sh.j2, plain bash), and carries the
static Python helper (boot_helper_text: one program on the node, authored in the parts under
templates/boot/boot_helper/). The script's own header documents what it
reads (endpoint overrides, TPUSERVE_ROOT), the paths it writes and the guest attributes it records
(namespace `GUEST_ATTRIBUTE_NAMESPACE`, keys `GUEST_ATTRIBUTE_KEYS`).
"""

from __future__ import annotations

import shlex
from typing import Any

from tpuserve.contracts import GUEST_ATTRIBUTE_KEYS as GUEST_ATTRIBUTE_KEYS
from tpuserve.contracts import GUEST_ATTRIBUTE_NAMESPACE
from tpuserve.facts import COLD_START_S, WARM_START_S
from tpuserve.paths import TEMPLATE_DIR
from tpuserve.render import collector_conf
from tpuserve.render.proxy_conf import NODE_LAYOUT, render_nginx_conf
from tpuserve.render.templates import environment
from tpuserve.render.vllm_args import (
    CONTAINER_CACHE_DIR,
    CONTAINER_HF_TOKEN_PATH,
    CONTAINER_NAME,
    compile_cache_key,
    container_env,
    listen_argv,
    serve_argv,
    served_config_sha256,
)
from tpuserve.settings import Deployment

# vLLM's own port when the API-key proxy owns the public one (loopback only).
VLLM_BACKEND_PORT = 8001
PROXY_CONTAINER_NAME = "tpuserve-proxy"
# The entry template, and the helper it carries (static text, no config value): one file,
# boot_helper.py, on the node (and in the fleet's ConfigMap), authored in parts by concern (the
# header, imports and one-shot subcommands; the watcher's bounds and its bounded HTTP request;
# the watcher and the subcommand table) that join, in this order, into it.
BOOT_TEMPLATE = "boot/startup.sh.j2"
BOOT_HELPER_PARTS = tuple(TEMPLATE_DIR / "boot" / "boot_helper" / name
                          for name in ("commands.py", "watch_bounds.py", "watcher.py"))
# Compile-cache objects in the stack's bucket: PREFIX + <cache key>-<12 hex of the image
# digest> + ".tar.gz". The cache key is computed here, once (vllm_args.compile_cache_key); the
# image's part is only known at boot, and only the script adds it (cache_select).
CACHE_OBJECT_PREFIX = "xla-cache/"
# SPEC 4: a cold boot took COLD_START_S (most of it XLA compilation); vLLM is called failed
# after ~2.8x that (2400 s), room for a slow pull or a busy zone.
READY_TIMEOUT_S = int(round(2.8 * COLD_START_S, -2))
# A cache download is abandoned after this long: a restore may never cost more than the warm
# cache saves (COLD_START_S - WARM_START_S), with room for the tries' pauses.
CACHE_GET_MAX_S = int(COLD_START_S - WARM_START_S) * 2 // 3


def boot_helper_text() -> str:
    """The node's boot_helper.py: its parts joined in order (each ends with a newline)."""
    return "".join(part.read_text() for part in BOOT_HELPER_PARTS)


def sh_quote(value: object) -> str:
    """Always single-quoted (shellcheck reads a bare us-west4-a as arithmetic)."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


_env = environment(q=sh_quote)  # values reach bash only through `q`


def vllm_command(d: Deployment, *, backend_port: int = VLLM_BACKEND_PORT) -> list[str]:
    """The full `vllm serve` argv run in the container, listener included."""
    if d.access.api_key_proxy:
        return serve_argv(d.vllm) + listen_argv("127.0.0.1", backend_port)
    return serve_argv(d.vllm) + listen_argv("0.0.0.0", d.vllm.port)


def startup_context(d: Deployment, *, backend_port: int = VLLM_BACKEND_PORT) -> dict[str, Any]:
    """Every value the templates use. `backend_port` is only changed by tests (a free port)."""
    argv = vllm_command(d, backend_port=backend_port)
    ctx: dict[str, Any] = {
        "stack": d.name,
        "provisioning_model": d.stack.provisioning_model,
        "node_name": d.node_name,
        "project": d.gcp.project,
        "zone": d.gcp.zone,
        "hf_secret": d.hf_token_secret_id,
        "api_key_secret": d.api_key_secret_id if d.access.api_key_proxy else "",
        "image": d.vllm.image,
        "container_name": CONTAINER_NAME,
        "container_env": container_env(d.vllm),
        "container_cache_dir": CONTAINER_CACHE_DIR,
        "container_token_path": CONTAINER_HF_TOKEN_PATH,
        "shm_size": d.vllm.shm_size,
        "vllm_argv": shlex.join(argv),
        "public_port": d.vllm.port,
        "backend_port": backend_port if d.access.api_key_proxy else d.vllm.port,
        "proxy_image": d.access.proxy_image,
        # The proxy terminates TLS: without it there is no TLS (config refuses the mix).
        "tls": ("self-signed" if d.access.tls_on else "off") if d.access.api_key_proxy else "",
        "proxy_key_path": NODE_LAYOUT.key_include,
        "proxy_cert_path": NODE_LAYOUT.tls_cert,
        "proxy_tls_key_path": NODE_LAYOUT.tls_key,
        "proxy_container": PROXY_CONTAINER_NAME,
        "cache_bucket": d.cache_bucket if d.cache.enabled else "",
        "cache_key": compile_cache_key(d, argv),
        "config_sha256": served_config_sha256(d, argv),
        "cache_prefix": CACHE_OBJECT_PREFIX,
        "cache_get_max_s": CACHE_GET_MAX_S,
        "ready_timeout_s": READY_TIMEOUT_S,
        "ga_namespace": GUEST_ATTRIBUTE_NAMESPACE,
        "boot_helper": boot_helper_text(),
    }
    ctx["nginx_conf"] = render_nginx_conf(
        public_port=d.vllm.port, backend_port=backend_port, tls=ctx["tls"] == "self-signed",
    ) if d.access.api_key_proxy else ""
    # The metrics collector (render/collector_conf.py): scrapes vLLM where it listens, on
    # loopback. Empty config text: the collector is off, and the boot removes a running one.
    ctx["metrics_image"] = d.monitoring.collector_image
    ctx["metrics_container"] = collector_conf.COLLECTOR_CONTAINER_NAME
    ctx["metrics_conf_path"] = collector_conf.COLLECTOR_CONFIG_PATH
    ctx["metrics_memory"] = collector_conf.CONTAINER_MEMORY
    ctx["collector_conf"] = collector_conf.render_collector_conf(
        d, backend_port=ctx["backend_port"],
    ) if d.monitoring.metrics else ""
    return ctx


def render_startup(d: Deployment, *, backend_port: int = VLLM_BACKEND_PORT) -> str:
    ctx = startup_context(d, backend_port=backend_port)
    return _env.get_template(BOOT_TEMPLATE).render(**ctx)

