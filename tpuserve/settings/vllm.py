"""[vllm] and [vllm.env]: the `vllm serve` flags and tpu-inference variables, with every measured
rule of SPEC 4 as a validator."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
)

from tpuserve.facts import (
    GPU_MEM_CEILING,
    GPU_MEM_FATAL,
    KV_DTYPES_FATAL,
    KV_DTYPES_FP8,
    KV_DTYPES_OK,
    KV_DTYPES_UNTESTED,
    MM_ITEM_TOKENS,
)
from tpuserve.settings import string_rules as rules
from tpuserve.settings.base import StrictModel, image_reference, spec_error
from tpuserve.settings.string_rules import check


class TpuInferenceEnv(StrictModel):
    """tpu-inference environment variables (SPEC 4); names are the variables themselves."""

    ATTN_BUCKETIZED_NUM_REQS: bool = False
    SLICE_ROPE_CACHE: bool = False
    NUM_PRECOMPILE_WORKERS: Annotated[int, Field(ge=1, le=64)] = 1
    VLLM_TPU_BUCKET_PADDING_GAP: Annotated[int, Field(ge=0, le=65536)] = 0
    VLLM_XLA_CHECK_RECOMPILATION: bool = False


class VllmSettings(StrictModel):
    model: str = "google/gemma-4-E2B-it"
    image: str = "vllm/vllm-tpu:nightly"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    dtype: Literal["bfloat16"] = "bfloat16"
    kv_cache_dtype: str = "auto"
    max_model_len: Annotated[int, Field(ge=16, le=1_048_576)] = 32768
    # Declared before max_num_batched_tokens: its multimodal floor reads them.
    disable_chunked_mm_input: bool = True
    limit_mm_per_prompt: dict[
        Literal["image", "audio", "video"], Annotated[int, Field(ge=0, le=1024)]
    ] = (
        Field(default_factory=lambda: {"image": 4, "audio": 1})
    )
    max_num_batched_tokens: Annotated[int, Field(ge=16, le=1_048_576)] = 4096
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] | None = None
    block_size: int | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=256)] = 1
    allow_untested_gpu_memory_utilization: bool = False
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = GPU_MEM_CEILING
    kv_cache_memory_bytes: Annotated[int, Field(gt=0, le=1 << 50)] | None = None
    enable_prefix_caching: bool = True
    enable_auto_tool_choice: bool = True
    tool_call_parser: str | None = "gemma4"
    reasoning_parser: str | None = "gemma4"
    shm_size: str = "10gb"
    env: TpuInferenceEnv = Field(default_factory=TpuInferenceEnv)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: object) -> object:
        if v != "bfloat16":
            raise spec_error(
                "vllm.dtype", v, "only bfloat16 is supported",
                "SPEC 4: weights quantization is bf16 only; w4a16, mxfp4, int8/int4 PTQ, AWQ and "
                "GGUF do not boot on the JAX path",
            )
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return image_reference("vllm.image", v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return check("vllm.model", v, rules.HF_REPO)

    @field_validator("tool_call_parser", "reasoning_parser", mode="before")
    @classmethod
    def _parser(cls, v: object, info: ValidationInfo) -> object:
        # TOML has no null: "" is how a user switches a parser off.
        if v == "":
            return None
        if isinstance(v, str):
            check(f"vllm.{info.field_name}", v, rules.PARSER)
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        return check("vllm.shm_size", v, rules.SHM_SIZE)

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, v: str) -> str:
        if v in KV_DTYPES_OK or v in KV_DTYPES_FP8:
            return v
        if v == "int8":
            raise spec_error(
                "vllm.kv_cache_dtype", v, "not a vLLM choice",
                "SPEC 4: rejected by the CLI enum: invalid choice: 'int8'",
            )
        if v in KV_DTYPES_FATAL or v.startswith("turboquant_"):
            raise spec_error(
                "vllm.kv_cache_dtype", v, "use auto (bf16) or an fp8 variant",
                "SPEC 4: accepted by the CLI, then kills the server at boot on this build",
            )
        if v in KV_DTYPES_UNTESTED:
            raise spec_error(
                "vllm.kv_cache_dtype", v, "untested on this build; use auto",
                "SPEC 4: accepted by the CLI but never booted; its siblings "
                "int8_per_token_head and nvfp4 kill the server at boot",
            )
        raise spec_error(
            "vllm.kv_cache_dtype", v, "unknown; use auto",
            "SPEC 4: auto, bfloat16 and fp8/fp8_e4m3/fp8_e5m2 are the values that boot",
        )

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int | None) -> int | None:
        if v is not None:
            raise spec_error(
                "vllm.block_size", v, "never set it; the backend picks it from max_model_len",
                "SPEC 4: a misconfigured 2048 blocks per request decoded at 8.32 ms TPOT "
                "against 8.02 ms for the backend's own 512",
            )
        return v

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _gpu_mem(cls, v: float, info: ValidationInfo) -> float:
        if v >= GPU_MEM_FATAL:
            raise spec_error(
                "vllm.gpu_memory_utilization", v, f"must be <= {GPU_MEM_CEILING}",
                "SPEC 4: 0.95 died 691 s into boot with RuntimeProgramAllocationFailure "
                "(compiled XLA programs need the 1.26 GiB left outside the cap), twice",
            )
        if v > GPU_MEM_CEILING and not info.data.get("allow_untested_gpu_memory_utilization"):
            raise spec_error(
                "vllm.gpu_memory_utilization", v,
                f"must be <= {GPU_MEM_CEILING}; 0.93-0.94 need "
                "allow_untested_gpu_memory_utilization = true",
                f"SPEC 4: {GPU_MEM_CEILING} is the measured ceiling, 0.93/0.94 are untested "
                "(estimated "
                "margins ~291 MB / ~127 MB), 0.95 died at boot",
            )
        return v

    @field_validator("tensor_parallel_size")
    @classmethod
    def _tp(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"vllm.tensor_parallel_size = {v}: must be a power of two")
        return v

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _mm_floor(cls, v: int, info: ValidationInfo) -> int:
        limits = info.data.get("limit_mm_per_prompt") or {}
        if info.data.get("disable_chunked_mm_input") and any(limits.values()) and (
            v < MM_ITEM_TOKENS
        ):
            raise spec_error(
                "vllm.max_num_batched_tokens", v,
                f"must be >= {MM_ITEM_TOKENS} while disable_chunked_mm_input is on with "
                "multimodal inputs (4096 recommended); a text-only deployment may set "
                "limit_mm_per_prompt to zeros and drop disable_chunked_mm_input",
                "SPEC 4: the server fails at boot with 'ValueError: Chunked MM input disabled "
                f"but max_tokens_per_mm_item ({MM_ITEM_TOKENS}) is larger than "
                f"max_num_batched_tokens ({v}). Please increase max_num_batched_tokens.'",
            )
        return v


