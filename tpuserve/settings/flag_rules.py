"""The measured rule behind each `vllm serve` flag and tpu-inference variable (SPEC 4).

`review` prints these next to a changed flag so a reviewer sees why the old value was chosen
without opening SPEC. They explain; they do not enforce: the validators in tpuserve/settings/vllm.py
stop a bad value. Measured numbers come from tpuserve/facts.py, as the validators' do.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve.facts import COLD_START_S, E2B_MEASURED_TPOT_MS, GPU_MEM_CEILING, MM_ITEM_TOKENS

# The positional model argument of `vllm serve MODEL` is reported under this name; the
# container image (not an argument, but it decides the compiled programs) under "image".
MODEL_ARG = "model"


@dataclass(frozen=True)
class FlagRule:
    name: str  # the flag as vLLM spells it, or the environment variable
    setting: str  # where it is set in config/default.toml
    rule: str  # what was measured, one short line, with its SPEC section


_RULES = (
    FlagRule(MODEL_ARG, "vllm.model",
             "google/gemma-4-E2B-it in bf16 is what every SPEC figure was measured on (SPEC 1)"),
    FlagRule("image", "vllm.image",
             "pin a tag or a manifest digest (repo@sha256:...); the measured build was "
             "vllm/vllm-tpu:nightly, vLLM 0.26.1rc1.dev125 (SPEC 1)"),
    FlagRule("--dtype", "vllm.dtype",
             "bfloat16 only: w4a16, mxfp4, int8/int4 PTQ, AWQ and GGUF do not boot on the JAX "
             "path (SPEC 4)"),
    FlagRule("--kv-cache-dtype", "vllm.kv_cache_dtype",
             "auto (bf16): fp8 buys 1.000x KV capacity at ~2% lower throughput; "
             "int8_per_token_head, nvfp4 and turboquant_* kill the server at boot (SPEC 4)"),
    FlagRule("--max-model-len", "vllm.max_model_len",
             "the backend keeps 512 blocks per request: 16384 -> block 32, 10,043 blocks; "
             "32768 -> block 64, 5,021 blocks; doubling it costs no KV capacity (SPEC 4)"),
    FlagRule("--max-num-batched-tokens", "vllm.max_num_batched_tokens",
             "4096: TPU compiles a power-of-two ladder and rounds up (2496 cost -24.7% at 8k/64); "
             f"multimodal input needs >= {MM_ITEM_TOKENS} or boot fails (SPEC 4)"),
    FlagRule("--max-num-seqs", "vllm.max_num_seqs",
             "leave the default 256: capping at 64 was worse in every measured cell (SPEC 4)"),
    FlagRule("--tensor-parallel-size", "vllm.tensor_parallel_size",
             "1 on one chip: the single KV head is padded to a multiple of TP, so TP=4 pays 4x "
             "KV memory (SPEC 4)"),
    FlagRule("--gpu-memory-utilization", "vllm.gpu_memory_utilization",
             f"{GPU_MEM_CEILING} is the ceiling: it governs weights + KV only; 0.95 died 691 s "
             "into boot with "
             "RuntimeProgramAllocationFailure, twice (SPEC 4)"),
    FlagRule("--kv-cache-memory", "vllm.kv_cache_memory_bytes",
             "the KV pool in bytes instead of the fraction; skips memory profiling on later "
             "boots; measured-good 5923602432 (SPEC 4)"),
    FlagRule("--block-size", "vllm.block_size",
             "never set it: the backend's 512 blocks per request decode at "
             f"{E2B_MEASURED_TPOT_MS} ms TPOT, a "
             "misconfigured 2048 at 8.32 ms (SPEC 4)"),
    FlagRule("--enable-prefix-caching", "vllm.enable_prefix_caching",
             "on in the measured serving command: requests sharing a prefix reuse KV blocks "
             "(SPEC 4)"),
    FlagRule("--disable-chunked-mm-input", "vllm.disable_chunked_mm_input",
             "the multimodal contract: with image 4 / audio 1 one item needs "
             f"{MM_ITEM_TOKENS} batched "
             "tokens; a text-only deployment may drop it (SPEC 4)"),
    FlagRule("--limit-mm-per-prompt", "vllm.limit_mm_per_prompt",
             '{"image":4,"audio":1} with --disable-chunked-mm-input sets the '
             f"{MM_ITEM_TOKENS}-token floor "
             "of max-num-batched-tokens (SPEC 4)"),
    FlagRule("--enable-auto-tool-choice", "vllm.enable_auto_tool_choice",
             "OpenAI-compatible tool calling; its structured-decoding programs are paid from "
             "the 1.26 GiB outside the cap (SPEC 4)"),
    FlagRule("--tool-call-parser", "vllm.tool_call_parser",
             "gemma4: OpenAI-compatible tool calling; structured-decoding programs live in the "
             "1.26 GiB outside the cap (SPEC 4)"),
    FlagRule("--reasoning-parser", "vllm.reasoning_parser",
             "gemma4: separates reasoning from the answer; its programs share the 1.26 GiB "
             "outside the cap (SPEC 4)"),
    FlagRule("--host", "access.api_key_proxy",
             "loopback behind the API-key proxy, 0.0.0.0 without it: vLLM's --api-key guards "
             "only /v1 (README, Access)"),
    FlagRule("--port", "vllm.port",
             "8000 is the public OpenAI-compatible port; vLLM moves to 8001 behind the API-key "
             "proxy (SPEC 1)"),
    # tpu-inference environment variables (SPEC 4 table).
    FlagRule("ATTN_BUCKETIZED_NUM_REQS", "vllm.env.ATTN_BUCKETIZED_NUM_REQS",
             "off by default: precompiles attention at power-of-two request buckets instead of "
             "one shape at max_num_seqs (SPEC 4)"),
    FlagRule("SLICE_ROPE_CACHE", "vllm.env.SLICE_ROPE_CACHE",
             "off by default: slices the rotary cache to max_model_len at load, freeing HBM "
             "(SPEC 4)"),
    FlagRule("NUM_PRECOMPILE_WORKERS", "vllm.env.NUM_PRECOMPILE_WORKERS",
             "1 by default: parallel XLA precompilation; compilation is 685 of the "
             f"{COLD_START_S:.0f} s cold "
             "start (SPEC 4)"),
    FlagRule("VLLM_TPU_BUCKET_PADDING_GAP", "vllm.env.VLLM_TPU_BUCKET_PADDING_GAP",
             "0 by default (powers of two); 128 gives linear bucket steps, untested and "
             "plausibly better (SPEC 4)"),
    FlagRule("VLLM_XLA_CHECK_RECOMPILATION", "vllm.env.VLLM_XLA_CHECK_RECOMPILATION",
             "off by default: errors on a runtime recompilation; turn on for a validation boot "
             "(SPEC 4)"),
    FlagRule("HF_HOME", "(fixed)",
             "/dev/shm: the 9.54 GiB checkpoint downloads into shared memory in ~10 s (SPEC 4)"),
    FlagRule("HF_TOKEN_PATH", "(fixed)",
             "the token is a read-only file from Secret Manager, never -e HF_TOKEN=value "
             "(SPEC 3)"),
)

FLAG_RULES: dict[str, FlagRule] = {r.name: r for r in _RULES}


def rule_for(name: str) -> FlagRule | None:
    """The measured rule behind a flag (`--max-model-len`), `model`, or an env var name."""
    return FLAG_RULES.get(name)
