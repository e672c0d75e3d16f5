"""Config -> the `vllm serve` argv and the container's environment: the single source of truth.

With the defaults, `serve_argv` reproduces SPEC section 4's command flag for flag. The HF
token is the one deliberate difference: it reaches the container as a read-only file named by
HF_TOKEN_PATH, never as `-e HF_TOKEN=value` (SPEC 3: it would show in `docker inspect`).
"""

from __future__ import annotations

import hashlib
import json

from tpuserve.settings import Deployment
from tpuserve.settings.vllm import TpuInferenceEnv, VllmSettings

# Paths inside the container (fixed: the compile-cache key and the boot script rely on them).
CONTAINER_CACHE_DIR = "/root/.cache/vllm"  # SPEC 4: the JAX/XLA compile cache lives here
CONTAINER_HF_HOME = "/dev/shm"  # SPEC 4: HF_HOME=/dev/shm
CONTAINER_HF_TOKEN_PATH = "/run/secrets/hf_token"
CONTAINER_NAME = "vllm-gemma4"  # SPEC 4's container name


def serve_argv(v: VllmSettings) -> list[str]:
    """`vllm serve MODEL --flag ...` in SPEC 4's order; unset options are left to vLLM."""
    for name in ("model", "kv_cache_dtype", "tool_call_parser", "reasoning_parser"):
        value = getattr(v, name)
        # the settings' patterns refuse these already; a model built around them must not
        # turn a value into an option of vLLM either.
        if isinstance(value, str) and value.startswith("-"):
            raise ValueError(f"vllm.{name} = {value[:80]!r}: must not begin with '-' "
                             "(vLLM would read it as an option)")
    argv = ["vllm", "serve", v.model]
    # dtype, kv-cache-dtype and gpu-memory-utilization restate vLLM's defaults: kept for audit.
    argv += ["--dtype", v.dtype, "--kv-cache-dtype", v.kv_cache_dtype]
    argv += ["--max-model-len", str(v.max_model_len)]
    argv += ["--max-num-batched-tokens", str(v.max_num_batched_tokens)]
    if v.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(v.max_num_seqs)]
    argv += ["--tensor-parallel-size", str(v.tensor_parallel_size)]
    if v.kv_cache_memory_bytes is not None:
        # SPEC 4: bytes instead of the fraction; skips memory profiling on later boots.
        argv += ["--kv-cache-memory", str(v.kv_cache_memory_bytes)]
    else:
        argv += ["--gpu-memory-utilization", _num(v.gpu_memory_utilization)]
    if v.enable_prefix_caching:
        argv.append("--enable-prefix-caching")
    if v.disable_chunked_mm_input:
        argv.append("--disable-chunked-mm-input")
    if v.limit_mm_per_prompt:
        argv += ["--limit-mm-per-prompt", json.dumps(v.limit_mm_per_prompt, separators=(",", ":"))]
    if v.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if v.tool_call_parser:
        argv += ["--tool-call-parser", v.tool_call_parser]
    if v.reasoning_parser:
        argv += ["--reasoning-parser", v.reasoning_parser]
    return argv


def listen_argv(host: str, port: int) -> list[str]:
    """Where vLLM listens; kept apart so serve_argv stays comparable with SPEC 4."""
    return ["--host", host, "--port", str(port)]


def _num(x: float) -> str:
    return f"{x:g}"


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
