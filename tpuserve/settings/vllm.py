"""[vllm] and [vllm.env]: the `vllm serve` flags and tpu-inference variables; every measured rule
of SPEC 4 (settings/measured_rules.py) is enforced by the validators here."""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tpuserve.facts import GPU_MEM_CEILING
from tpuserve.settings import measured_rules, speculative
from tpuserve.settings import string_rules as rules
from tpuserve.settings.base import StrictModel, image_reference
from tpuserve.settings.measured_rules import Flag
from tpuserve.settings.model_profiles import with_profile
from tpuserve.settings.string_rules import check


class TpuInferenceEnv(StrictModel):
    """tpu-inference environment variables (SPEC 4); names are the variables themselves."""

    ATTN_BUCKETIZED_NUM_REQS: bool = False
    SLICE_ROPE_CACHE: bool = False
    NUM_PRECOMPILE_WORKERS: Annotated[int, Field(ge=1, le=64)] = 1
    VLLM_TPU_BUCKET_PADDING_GAP: Annotated[int, Field(ge=0, le=65536)] = 0
    VLLM_XLA_CHECK_RECOMPILATION: bool = False


class VllmSettings(StrictModel):
    """The server: the model, the vLLM image, and the `vllm serve` flags it runs with.

    A field's `Flag` is the option it renders to, in this order (tpuserve/render/
    vllm_args.py); its measured rules are in settings/measured_rules.py."""

    model: str = "google/gemma-4-E2B-it"
    image: str = "vllm/vllm-tpu:nightly"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    dtype: Annotated[Literal["bfloat16"], Flag("--dtype")] = "bfloat16"
    kv_cache_dtype: Annotated[str, Flag("--kv-cache-dtype")] = "auto"
    max_model_len: Annotated[int, Field(ge=16, le=1_048_576), Flag("--max-model-len")] = 32768
    # Declared before max_num_batched_tokens: its multimodal floor reads them.
    disable_chunked_mm_input: Annotated[
        bool, Flag("--disable-chunked-mm-input", after="enable_prefix_caching")
    ] = True
    limit_mm_per_prompt: Annotated[
        dict[Literal["image", "audio", "video"], Annotated[int, Field(ge=0, le=1024)]],
        Flag("--limit-mm-per-prompt", after="disable_chunked_mm_input"),
    ] = Field(default_factory=lambda: {"image": 4, "audio": 1})
    max_num_batched_tokens: Annotated[
        int, Field(ge=16, le=1_048_576), Flag("--max-num-batched-tokens")
    ] = 4096
    max_num_seqs: Annotated[
        Annotated[int, Field(ge=1, le=4096)] | None, Flag("--max-num-seqs")
    ] = None
    block_size: Annotated[int | None, Flag("--block-size")] = None
    # None: the slice's chip count (settings/accelerator_rules.py derives it per deployment).
    tensor_parallel_size: Annotated[
        Annotated[int, Field(ge=1, le=256)] | None, Flag("--tensor-parallel-size")
    ] = None
    allow_untested_gpu_memory_utilization: bool = False
    # Left out of the argv when kv_cache_memory_bytes is set (vllm_args.py).
    gpu_memory_utilization: Annotated[
        float, Field(gt=0.0, le=1.0), Flag("--gpu-memory-utilization")
    ] = GPU_MEM_CEILING
    kv_cache_memory_bytes: Annotated[
        Annotated[int, Field(gt=0, le=1 << 50)] | None, Flag("--kv-cache-memory")
    ] = None
    enable_prefix_caching: Annotated[bool, Flag("--enable-prefix-caching")] = True
    enable_auto_tool_choice: Annotated[bool, Flag("--enable-auto-tool-choice")] = True
    tool_call_parser: Annotated[str | None, Flag("--tool-call-parser")] = "gemma4"
    reasoning_parser: Annotated[str | None, Flag("--reasoning-parser")] = "gemma4"
    # Lets vllm.speculative_config through: no method was booted on the pinned image, a moving
    # tag whose build cannot be checked for the methods it carries (settings/speculative.py).
    allow_untested_speculative_config: bool = False
    # vLLM's --speculative-config JSON as a table (or its JSON text), e.g. { method = "ngram",
    # num_speculative_tokens = 4, prompt_lookup_max = 4 }; keys method (ngram: the TPU
    # backend's method without a draft checkpoint), num_speculative_tokens (1-16),
    # prompt_lookup_max and prompt_lookup_min (1-64); unset: no speculative decoding.
    speculative_config: Annotated[
        dict[str, Any] | None, Flag("--speculative-config")
    ] = None
    shm_size: str = "10gb"
    env: TpuInferenceEnv = Field(default_factory=lambda: TpuInferenceEnv())  # see Deployment

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: object) -> object:
        # The model's own parsers and multimodal limits, never another model's (model_profiles).
        return with_profile(data) if isinstance(data, dict) else data

    @field_validator(*measured_rules.checked_fields("vllm", before=True), mode="before")
    @classmethod
    def _measured_before(cls, v: object, info: ValidationInfo) -> object:
        return measured_rules.enforce(f"vllm.{info.field_name}", v, info.data)

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

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _speculative(cls, v: object, info: ValidationInfo) -> object:
        return speculative.require_allowed(
            speculative.parse(v), bool(info.data.get("allow_untested_speculative_config")))

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        return check("vllm.shm_size", v, rules.SHM_SIZE)

    @field_validator("tensor_parallel_size")
    @classmethod
    def _tp(cls, v: int | None) -> int | None:
        if v is not None and v & (v - 1):
            raise ValueError(f"vllm.tensor_parallel_size = {v}: must be a power of two")
        return v

    # After every other validator of a field: the measured rules see a value of its type.
    @field_validator(*measured_rules.checked_fields("vllm", before=False))
    @classmethod
    def _measured(cls, v: object, info: ValidationInfo) -> object:
        # The context (loader: measured_rules.rule_context) names the chip a rule is for.
        return measured_rules.enforce(f"vllm.{info.field_name}", v, info.data, info.context)
