"""Renders templates/startup.sh.j2 from a Deployment. Pure: config in, text out."""

from __future__ import annotations

import shlex
from typing import Any

import jinja2

from .config import REPO_ROOT, Deployment
from .vllm_args import (
    CONTAINER_CACHE_DIR,
    CONTAINER_HF_TOKEN_PATH,
    CONTAINER_NAME,
    compile_cache_key,
    container_env,
    listen_argv,
    serve_argv,
)

TEMPLATE_DIR = REPO_ROOT / "templates"
# vLLM's own port when the API-key proxy owns the public one (loopback only).
VLLM_BACKEND_PORT = 8001

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # noqa: S701 - renders bash, not HTML; values are shell-quoted below
)
_env.filters["q"] = lambda v: shlex.quote(str(v))


def vllm_command(d: Deployment) -> list[str]:
    """The full `vllm serve` argv run in the container, listener included."""
    if d.access.api_key_proxy:
        return serve_argv(d.vllm) + listen_argv("127.0.0.1", VLLM_BACKEND_PORT)
    return serve_argv(d.vllm) + listen_argv("0.0.0.0", d.vllm.port)


def startup_context(d: Deployment) -> dict[str, Any]:
    argv = vllm_command(d)
    return {
        "d": d,
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
        "backend_port": VLLM_BACKEND_PORT if d.access.api_key_proxy else d.vllm.port,
        "proxy": d.access.api_key_proxy,
        "proxy_image": d.access.proxy_image,
        "cache_enabled": d.cache.enabled,
        "cache_bucket": d.cache_bucket,
        "cache_key": compile_cache_key(d, argv),
        "max_run_seconds": (
            int(d.stack.max_run_hours * 3600) if d.stack.provisioning_model != "flex" else 0
        ),
    }


def render_startup(d: Deployment) -> str:
    return _env.get_template("startup.sh.j2").render(**startup_context(d))
