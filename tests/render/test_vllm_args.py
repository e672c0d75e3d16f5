"""The argv and environment rendered from config: SPEC section 4, flag for flag."""

from __future__ import annotations

import shlex

from tpuserve.render.vllm_args import (
    compile_cache_key,
    container_env,
    serve_argv,
    tpu_inference_env,
)
from tpuserve.settings.vllm import TpuInferenceEnv, VllmSettings

# SPEC section 4's command, copied as printed (the part after the image).
SPEC_COMMAND = """vllm serve google/gemma-4-E2B-it \
    --dtype bfloat16 --kv-cache-dtype auto \
    --max-model-len 32768 --max-num-batched-tokens 4096 \
    --tensor-parallel-size 1 --gpu-memory-utilization 0.92 \
    --enable-prefix-caching --disable-chunked-mm-input \
    --limit-mm-per-prompt '{"image":4,"audio":1}' \
    --enable-auto-tool-choice --tool-call-parser gemma4 --reasoning-parser gemma4"""


def test_defaults_reproduce_the_spec_command_flag_for_flag() -> None:
    # TP unset in [vllm] alone is the slice's (the deployment derives 1 for v5litepod-1).
    assert serve_argv(VllmSettings(tensor_parallel_size=1)) == shlex.split(SPEC_COMMAND)


def test_container_env_has_no_token_value_and_only_changed_tpu_vars() -> None:
    env = container_env(VllmSettings())
    assert env == {"HF_HOME": "/dev/shm", "HF_TOKEN_PATH": "/run/secrets/hf_token"}
    assert "HF_TOKEN" not in env
    changed = TpuInferenceEnv(NUM_PRECOMPILE_WORKERS=2, VLLM_XLA_CHECK_RECOMPILATION=True)
    assert tpu_inference_env(changed) == {
        "NUM_PRECOMPILE_WORKERS": "2", "VLLM_XLA_CHECK_RECOMPILATION": "1"}


def test_kv_cache_memory_replaces_the_fraction() -> None:
    argv = serve_argv(VllmSettings(kv_cache_memory_bytes=5923602432))
    assert "--kv-cache-memory" in argv and "5923602432" in argv
    assert "--gpu-memory-utilization" not in argv


def test_text_only_drops_the_multimodal_flags() -> None:
    argv = serve_argv(VllmSettings(disable_chunked_mm_input=False, limit_mm_per_prompt={},
                                   max_num_batched_tokens=2048))
    assert "--disable-chunked-mm-input" not in argv and "--limit-mm-per-prompt" not in argv


def test_compile_cache_key_tracks_what_changes_compiled_programs(deployments) -> None:
    d = deployments["spot"]
    base = serve_argv(d.vllm)
    key = compile_cache_key(d, base)
    assert key == compile_cache_key(d, list(base))  # stable
    assert key != compile_cache_key(d, [*base, "--max-num-seqs", "64"])
    other = d.model_copy(update={"tpu": d.tpu.model_copy(update={"runtime_version": "v2-x"})})
    assert key != compile_cache_key(other, base)
    img = d.model_copy(update={"vllm": d.vllm.model_copy(update={"image": "vllm/vllm-tpu:v1"})})
    assert key != compile_cache_key(img, base)
