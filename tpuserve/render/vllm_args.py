"""Config -> the `vllm serve` argv and the container's environment: the single source of truth.

With the defaults, `serve_argv` reproduces SPEC section 4's command flag for flag. The HF
token is the one deliberate difference: it reaches the container as a read-only file named by
HF_TOKEN_PATH, never as `-e HF_TOKEN=value` (SPEC 3: it would show in `docker inspect`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import typing

from tpuserve.settings import Deployment
from tpuserve.settings.measured_rules import Flag
from tpuserve.settings.vllm import TpuInferenceEnv, VllmSettings

# Paths inside the container (fixed: the compile-cache key and the boot script rely on them).
CONTAINER_CACHE_DIR = "/root/.cache/vllm"  # SPEC 4: the JAX/XLA compile cache lives here
CONTAINER_HF_HOME = "/dev/shm"  # SPEC 4: HF_HOME=/dev/shm
CONTAINER_HF_TOKEN_PATH = "/run/secrets/hf_token"
CONTAINER_NAME = "vllm-gemma4"  # SPEC 4's container name


def serve_argv(v: VllmSettings) -> list[str]:
    """`vllm serve MODEL --flag ...` in SPEC 4's order; unset options are left to vLLM.

    Every field with a `Flag` renders to its spelling in the settings' order; a switch appears
    when on, an unset option not at all. dtype, kv-cache-dtype and gpu-memory-utilization
    restate vLLM's defaults: kept for audit."""
    for name in ("model", "kv_cache_dtype", "tool_call_parser", "reasoning_parser"):
        value = getattr(v, name)
        # the settings' patterns refuse these already; a model built around them must not
        # turn a value into an option of vLLM either.
        if isinstance(value, str) and value.startswith("-"):
            raise ValueError(f"vllm.{name} = {value[:80]!r}: must not begin with '-' "
                             "(vLLM would read it as an option)")
    argv = ["vllm", "serve", v.model]
    for name, flag, kind in serve_flags():
        value = getattr(v, name)
        if name == "gpu_memory_utilization" and v.kv_cache_memory_bytes is not None:
            continue  # SPEC 4: the KV pool in bytes replaces the fraction
        if kind == "switch":
            if value:
                argv.append(flag)
        elif kind == "always" or value not in (None, "", {}):
            argv += [flag, _value(value)]
    return argv


@functools.cache
def serve_flags() -> tuple[tuple[str, str, str], ...]:
    """(field, flag, kind) of every flagged setting, in argv order: declaration order, with a
    flag that names `after` moved behind that field's. A bool is a switch (present when on);
    a setting that may be unset (None) or empty (a table) is an option left out when it is;
    any other is always passed."""
    flagged = [(name, m) for name, info in VllmSettings.model_fields.items()
               for m in info.metadata if isinstance(m, Flag)]
    order = [name for name, m in flagged if m.after is None]
    for name, m in flagged:
        if m.after is not None:
            order.insert(order.index(m.after) + 1, name)
    spelling = {name: m.spelling for name, m in flagged}
    return tuple((name, spelling[name], _kind(VllmSettings.model_fields[name].annotation))
                 for name in order)


def _kind(annotation: object) -> str:
    if annotation is bool:
        return "switch"
    if type(None) in typing.get_args(annotation) or typing.get_origin(annotation) is dict:
        return "option"
    return "always"


def _value(x: object) -> str:
    if isinstance(x, float):
        return f"{x:g}"
    if isinstance(x, dict):
        return json.dumps(x, separators=(",", ":"))
    return str(x)


def listen_argv(host: str, port: int) -> list[str]:
    """Where vLLM listens; kept apart so serve_argv stays comparable with SPEC 4."""
    return ["--host", host, "--port", str(port)]


def tpu_inference_env(env: TpuInferenceEnv) -> dict[str, str]:
    """Only the variables that differ from tpu-inference's defaults (SPEC 4 table)."""
    defaults = TpuInferenceEnv()
    out: dict[str, str] = {}
    for name in TpuInferenceEnv.model_fields:
        value = getattr(env, name)
        if value != getattr(defaults, name):
            out[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def container_env(v: VllmSettings) -> dict[str, str]:
    """Environment of the vLLM container. Holds no secret: the token is a mounted file."""
    return {
        "HF_HOME": CONTAINER_HF_HOME,
        "HF_TOKEN_PATH": CONTAINER_HF_TOKEN_PATH,
        **tpu_inference_env(v.env),
    }


def compile_cache_key(d: Deployment, argv: list[str]) -> str:
    """Everything that changes compiled XLA programs, hashed: a flag change is a new cache."""
    material = {
        "image": d.vllm.image,
        "model": d.vllm.model,
        "argv": argv,
        "env": tpu_inference_env(d.vllm.env),
        "accelerator_type": d.tpu.accelerator_type,
        "runtime_version": d.tpu.runtime_version,
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def served_config_sha256(d: Deployment, argv: list[str]) -> str:
    """What the running server serves with, hashed: image reference, the full `vllm serve`
    argv and the container's environment. The boot script publishes it (guest attribute
    `config`) and `tpuserve status` sets it beside the deployed config's, so a config change
    that has not reached the server shows."""
    material = {"image": d.vllm.image, "argv": argv, "env": container_env(d.vllm),
                "shm_size": d.vllm.shm_size}
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
