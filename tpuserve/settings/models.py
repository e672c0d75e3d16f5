"""The one validated configuration: TOML in, typed `Deployment` objects out.

Every measured rule of SPEC section 4 is a validator here; its message names the setting,
the bad value, the rule and the measurement behind it. Errors for every stack are gathered
and raised together (`ConfigError`) before anything is synthesized. Soft rules are warnings
(`deployment_warnings`), printed at synth.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.settings import string_rules as rules
from tpuserve.settings.string_rules import check, shown

STACK_NAMES = ("spot", "ondemand", "flex")
ProvisioningModel = Literal["spot", "ondemand", "flex"]

# SPEC 4: gpu_memory_utilization 0.92 is the measured ceiling; 0.95 died at boot twice.
GPU_MEM_CEILING = 0.92
GPU_MEM_FATAL = 0.95
# SPEC 4: one multimodal item needs 2496 tokens with --disable-chunked-mm-input and
# {"image":4,"audio":1}; 2048 failed at boot with this exact error.
MM_ITEM_TOKENS = 2496
# SPEC 4: the 16 values vLLM's --kv-cache-dtype accepts, sorted by what they do on this build.
KV_DTYPES_OK = frozenset({"auto", "bfloat16"})
KV_DTYPES_FP8 = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
KV_DTYPES_FATAL = frozenset({"int8_per_token_head", "fp8_inc", "fp8_ds_mla", "nvfp4"})
KV_DTYPES_UNTESTED = frozenset({"float16", "fp8_per_token_head", "int4_per_token_head"})
# SPEC 5: Gemma 4 E2B has one KV head (MQA).
MODEL_KV_HEADS = 1
IAP_RANGE = "35.235.240.0/20"  # Google's IAP TCP-forwarding range
MAX_FLEX_RUN_SECONDS = 7 * 24 * 3600  # flex-start lasts at most 7 days (SPEC 2, issue 3)
# The billing guard is a Cloud Tasks task; Cloud Tasks schedules at most 30 days ahead.
MAX_GUARD_RUN_HOURS = 30 * 24
# Subnets the project creates for itself: private IPv4 (RFC 1918) only, /8 to /29 (the
# smallest subnet Compute Engine accepts).
PRIVATE_V4 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                      "192.168.0.0/16"))
# Where flex-start takes v5litepod-1 (issue 3): known-good and known-bad zones, each with its
# source; any other zone is allowed with a warning (SPEC 2: quota in a zone says nothing about
# whether a provisioning model is accepted there).
FLEX_ZONES_GOOD = {
    "us-west4-a": "SPEC 1: measured, the QR went ACTIVE",
    "us-central1-a": "vendor: Google's docs list it for v5e serving",
}
FLEX_ZONES_BAD = {
    "europe-west4-a": "SPEC 1: measured",
    "europe-west4-b": "SPEC 1: measured",
}


class StrictModel(BaseModel):
    """Unknown keys are typos: reject them instead of silently ignoring a setting.

    Strict: TOML has types, so "off" is no boolean, "8000" no port and 1.5 no integer; and
    inf/nan are no numbers.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )


def _spec_error(setting: str, value: object, rule: str, why: str) -> ValueError:
    return ValueError(f"{setting} = {shown(value)}: {rule} ({why})")


def parse_duration(text: str) -> int:
    """'4h', '90m', '7d', '14400s' or '1h30m' -> seconds (gcloud's duration words)."""
    parts = re.findall(r"(\d+)([dhms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 4h, 90m, 7d or 14400s")
    scale = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * scale[u] for n, u in parts)


def image_reference(setting: str, v: str) -> str:
    """An image reference docker can pull: `vllm.image` and `access.proxy_image` alike."""
    if re.fullmatch(r"(sha256:)?[0-9a-f]{64}", v):
        raise _spec_error(
            setting, v, "give a tag (repo:tag) or a manifest digest (repo@sha256:...)",
            "SPEC 1: the sha256 id that `docker images` prints is a config-blob id; "
            "`docker pull` by it fails with 'unexpected media type'",
        )
    return check(setting, v, rules.IMAGE)


class GcpSettings(StrictModel):
    project: str
    zone: str = "us-west4-a"
    # Unset: the project creates a network and subnet of its own (`<deployment>-net`), so the
    # firewall rules are the only ones that apply. Set: bring your own (nothing is created).
    network: str | None = None
    # Names the long-lived resources every stack of one deployment shares (the network).
    deployment: str = "tpuserve"
    subnet_cidr: str = "10.64.0.0/20"

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        # The guard's service account id is `<deployment>-guard`: 6-30 characters in all.
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,18}[a-z0-9]", v):
            raise ValueError(
                f"gcp.deployment = {v!r}: 2-20 lowercase letters, digits or hyphens, starting "
                "with a letter and not ending with a hyphen (it prefixes resource names such "
                "as the service account <deployment>-guard, at most 30 characters)"
            )
        return v

    @field_validator("subnet_cidr")
    @classmethod
    def _subnet_cidr(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError as exc:
            raise ValueError(f"gcp.subnet_cidr = {v!r}: not a CIDR ({exc})") from None
        if not (isinstance(net, ipaddress.IPv4Network) and 8 <= net.prefixlen <= 29
                and any(net.subnet_of(p) for p in PRIVATE_V4)):
            raise ValueError(
                f"gcp.subnet_cidr = {v!r}: must be a private IPv4 range (10/8, 172.16/12 or "
                "192.168/16) from /8 to /29 (Compute Engine subnets: RFC 1918, /29 smallest)"
            )
        return v

    @field_validator("project")
    @classmethod
    def _project_id(cls, v: str) -> str:
        return check("gcp.project", v, rules.PROJECT)

    @field_validator("zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        return check("gcp.zone", v, rules.ZONE)

    @field_validator("network")
    @classmethod
    def _network(cls, v: str | None) -> str | None:
        # None: tpuserve creates the deployment's network.
        return None if v is None else check("gcp.network", v, rules.NETWORK)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


class TpuSettings(StrictModel):
    accelerator_type: str = "v5litepod-1"
    runtime_version: str = "v2-alpha-tpuv5-lite"

    @field_validator("runtime_version")
    @classmethod
    def _runtime(cls, v: str) -> str:
        return check("tpu.runtime_version", v, rules.RUNTIME_VERSION)

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator(cls, v: str) -> str:
        if re.fullmatch(r"v5e-[0-9]+", v):
            raise _spec_error(
                "tpu.accelerator_type", v, f"spell it 'v5litepod-{v.split('-')[1]}'",
                "SPEC 1: 'v5e-N' is prose; the TPU API only accepts v5litepod-N",
            )
        if not re.fullmatch(r"v5litepod-(1|4|8|16|32|64|128|256)", v):
            raise _spec_error(
                "tpu.accelerator_type", v, "must be a v5e slice: v5litepod-1, -4, -8 ... -256",
                "SPEC 1: this deployment targets Cloud TPU v5e",
            )
        return v

    @property
    def chips(self) -> int:
        return int(self.accelerator_type.rsplit("-", 1)[1])


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
            raise _spec_error(
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
            raise _spec_error(
                "vllm.kv_cache_dtype", v, "not a vLLM choice",
                "SPEC 4: rejected by the CLI enum: invalid choice: 'int8'",
            )
        if v in KV_DTYPES_FATAL or v.startswith("turboquant_"):
            raise _spec_error(
                "vllm.kv_cache_dtype", v, "use auto (bf16) or an fp8 variant",
                "SPEC 4: accepted by the CLI, then kills the server at boot on this build",
            )
        if v in KV_DTYPES_UNTESTED:
            raise _spec_error(
                "vllm.kv_cache_dtype", v, "untested on this build; use auto",
                "SPEC 4: accepted by the CLI but never booted; its siblings "
                "int8_per_token_head and nvfp4 kill the server at boot",
            )
        raise _spec_error(
            "vllm.kv_cache_dtype", v, "unknown; use auto",
            "SPEC 4: auto, bfloat16 and fp8/fp8_e4m3/fp8_e5m2 are the values that boot",
        )

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int | None) -> int | None:
        if v is not None:
            raise _spec_error(
                "vllm.block_size", v, "never set it; the backend picks it from max_model_len",
                "SPEC 4: a misconfigured 2048 blocks per request decoded at 8.32 ms TPOT "
                "against 8.02 ms for the backend's own 512",
            )
        return v

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _gpu_mem(cls, v: float, info: ValidationInfo) -> float:
        if v >= GPU_MEM_FATAL:
            raise _spec_error(
                "vllm.gpu_memory_utilization", v, f"must be <= {GPU_MEM_CEILING}",
                "SPEC 4: 0.95 died 691 s into boot with RuntimeProgramAllocationFailure "
                "(compiled XLA programs need the 1.26 GiB left outside the cap), twice",
            )
        if v > GPU_MEM_CEILING and not info.data.get("allow_untested_gpu_memory_utilization"):
            raise _spec_error(
                "vllm.gpu_memory_utilization", v,
                f"must be <= {GPU_MEM_CEILING}; 0.93-0.94 need "
                "allow_untested_gpu_memory_utilization = true",
                "SPEC 4: 0.92 is the measured ceiling, 0.93/0.94 are untested (estimated "
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
            raise _spec_error(
                "vllm.max_num_batched_tokens", v,
                f"must be >= {MM_ITEM_TOKENS} while disable_chunked_mm_input is on with "
                "multimodal inputs (4096 recommended); a text-only deployment may set "
                "limit_mm_per_prompt to zeros and drop disable_chunked_mm_input",
                "SPEC 4: the server fails at boot with 'ValueError: Chunked MM input disabled "
                f"but max_tokens_per_mm_item ({MM_ITEM_TOKENS}) is larger than "
                f"max_num_batched_tokens ({v}). Please increase max_num_batched_tokens.'",
            )
        return v


class AccessSettings(StrictModel):
    api_source_ranges: list[str] = Field(default_factory=list)
    ssh_source_ranges: list[str] = Field(default_factory=list)
    # vLLM's --api-key guards only /v1; the proxy checks the key on every path but /health.
    api_key_proxy: bool = True
    proxy_image: str = "nginx:1.27.3-alpine"
    # TLS on the public port, terminated by the proxy: "self-signed" makes a certificate on
    # the node (its key never leaves it) that the tpuserve CLI pins; "off" sends the key and
    # every prompt in clear text.
    tls: Literal["self-signed", "off"] = "self-signed"

    @property
    def tls_on(self) -> bool:
        """The proxy terminates TLS: with the proxy off, port 8000 is vLLM's plain HTTP."""
        return self.api_key_proxy and self.tls == "self-signed"

    @field_validator("proxy_image")
    @classmethod
    def _proxy_image(cls, v: str) -> str:
        return image_reference("access.proxy_image", v)

    @field_validator("api_source_ranges", "ssh_source_ranges")
    @classmethod
    def _cidrs(cls, v: list[str], info: ValidationInfo) -> list[str]:
        setting = f"access.{info.field_name}"
        if len(v) > 256:
            raise ValueError(f"{setting}: {len(v)} ranges; a firewall rule takes at most 256")
        for cidr in v:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                # ipaddress repeats the value: only a short printable one is worth its words.
                why = f" ({exc})" if re.fullmatch(r"[ -~]{1,64}", cidr) else ""
                raise ValueError(
                    f"{setting} = [{shown(cidr)}]: not a CIDR like 203.0.113.0/24{why}"
                ) from None
            if str(net) != cidr:  # a CIDR in its one canonical spelling, nothing around it
                raise ValueError(
                    f"{setting} = [{shown(cidr)}]: not a CIDR in canonical form (write {net})"
                )
        return v


# $/chip-hour bound: SPEC 2's list prices are 0.58-1.20; 100 catches a price typed per month
# or in cents without refusing any real TPU price.
MAX_USD_PER_CHIP_HOUR = 100.0
Price = Annotated[float, Field(gt=0, le=MAX_USD_PER_CHIP_HOUR)]


class PricingSettings(StrictModel):
    """$/chip-hour in us-west4, SPEC 2 (list prices: change them here, not in code)."""

    spot: Price = 0.5779
    flex: Price = 0.6000
    ondemand: Price = 1.2000

    @field_validator("spot", "flex", "ondemand", mode="before")
    @classmethod
    def _price(cls, v: object, info: ValidationInfo) -> object:
        if isinstance(v, int | float) and not isinstance(v, bool) and not (
            0 < v <= MAX_USD_PER_CHIP_HOUR
        ):
            raise _spec_error(
                f"pricing.{info.field_name}", v,
                f"must be a finite $/chip-hour above 0 and at most {MAX_USD_PER_CHIP_HOUR:g}",
                "SPEC 2: list prices are 0.58-1.20 $/chip-hour; a larger number is a price "
                "per month or in cents, and every cost figure would be wrong",
            )
        return v


class CacheSettings(StrictModel):
    """The XLA compile cache kept in a per-stack Cloud Storage bucket (SPEC 4: 857 s -> 497 s)."""

    enabled: bool = True
    # Days a cache may go unused before the bucket deletes it: every healthy boot that restores
    # or publishes it renews its object's customTime (lifecycle days_since_custom_time).
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class CapacitySettings(StrictModel):
    """Inputs of the capacity planner (SPEC 5-6) that synth checks against the KV pool."""

    # A Hugging Face config.json; relative paths are relative to the config/ directory.
    model_geometry: str = "models/gemma-4-E2B-it.json"
    # SPEC 5: resident bf16 weights measured on the chip (vision and audio towers included).
    weights_gib: Annotated[float, Field(gt=0, le=1024)] = 8.97
    # The load you plan for; synth warns when clients x context passes the KV wall (SPEC 6).
    expected_clients: Annotated[int, Field(ge=1, le=1_000_000)] | None = 16
    expected_context: Annotated[int, Field(ge=1, le=1 << 24)] | None = 1024

    @field_validator("model_geometry")
    @classmethod
    def _geometry(cls, v: str) -> str:
        return check("capacity.model_geometry", v, rules.GEOMETRY_PATH)

    @model_validator(mode="after")
    def _both_or_neither(self) -> CapacitySettings:
        if (self.expected_clients is None) != (self.expected_context is None):
            raise ValueError(
                "capacity.expected_clients and capacity.expected_context go together: "
                "set both or neither"
            )
        return self

    @property
    def geometry_path(self) -> Path:
        return (DEFAULT_CONFIG.parent / self.model_geometry).resolve()


class StateSettings(StrictModel):
    """Where Terraform keeps each stack's state: local files, or a GCS bucket for teams/CI."""

    gcs_bucket: str | None = None
    gcs_prefix: str = "tpuserve"

    @field_validator("gcs_bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is not None:
            check("state.gcs_bucket", v, rules.GCS_BUCKET)
            if len(v) < 3 or any(len(part) > 63 for part in v.split(".")):
                raise _spec_error("state.gcs_bucket", v, "3-222 characters, 63 at most a part",
                                  "Cloud Storage bucket naming rules")
        return v

    @field_validator("gcs_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        return check("state.gcs_prefix", v, rules.GCS_PREFIX)


class StackSettings(StrictModel):
    provisioning_model: ProvisioningModel
    # Billing guard for spot/ondemand: a Cloud Tasks task deletes the node this many hours
    # after its createTime (0: off); Cloud Tasks schedules at most 30 days ahead.
    max_run_hours: Annotated[float, Field(ge=0)] = 8
    # Flex-start only (SPEC 2): the node deletes itself after this long.
    max_run_duration: str = "4h"
    valid_until_duration: str | None = None

    @field_validator("max_run_hours")
    @classmethod
    def _guard_hours(cls, v: float) -> float:
        # The guard counts whole seconds: below one, int(hours * 3600) is 0, which means "off".
        if 0 < v * 3600 < 1:
            raise _spec_error(
                "stack.max_run_hours", v, "must be 0 (guard off) or at least 1/3600 (one second)",
                "the billing guard counts whole seconds; a shorter limit would silently turn it "
                "off while the guard keeps its rights",
            )
        if v > MAX_GUARD_RUN_HOURS:
            raise _spec_error(
                "stack.max_run_hours", v, f"must be at most {MAX_GUARD_RUN_HOURS} (30 days)",
                "the billing guard is a Cloud Tasks task, and Cloud Tasks schedules a task at "
                "most 30 days ahead",
            )
        return v

    @field_validator("max_run_duration", "valid_until_duration")
    @classmethod
    def _duration(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        check(f"stack.{info.field_name}", v, rules.DURATION)
        seconds = parse_duration(v)
        if not 0 < seconds <= MAX_FLEX_RUN_SECONDS and info.field_name == "max_run_duration":
            raise _spec_error(
                f"stack.{info.field_name}", v, "must be more than 0 and at most 7d",
                "flex-start capacity lasts at most 7 days",
            )
        if seconds == 0:  # valid_until_duration: how long the request may wait in the queue
            raise _spec_error(
                f"stack.{info.field_name}", v, "must be more than 0 (or unset: no limit)",
                "a queued resource that may wait 0 s can never be provisioned",
            )
        return v


class Deployment(StrictModel):
    """One stack's validated configuration."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,11}$")]
    gcp: GcpSettings
    tpu: TpuSettings = Field(default_factory=TpuSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    state: StateSettings = Field(default_factory=StateSettings)
    stack: StackSettings

    @model_validator(mode="after")
    def _label_values(self) -> Deployment:
        # Derived, but checked: a label value reaches Terraform and the TPU API.
        for key, value in self.labels.items():
            check(f"labels.{key} (derived from the config)", value, rules.LABEL_VALUE)
        return self

    @model_validator(mode="after")
    def _tp_chips(self) -> Deployment:
        if self.vllm.tensor_parallel_size > self.tpu.chips:
            raise _spec_error(
                "vllm.tensor_parallel_size", self.vllm.tensor_parallel_size,
                f"must be <= the {self.tpu.chips} chip(s) of {self.tpu.accelerator_type}",
                "SPEC 4: tensor parallelism splits the model across chips",
            )
        return self

    @model_validator(mode="after")
    def _flex_zone(self) -> Deployment:
        zone, accel = self.gcp.zone, self.tpu.accelerator_type
        if self.stack.provisioning_model == "flex" and accel == "v5litepod-1" and (
            zone in FLEX_ZONES_BAD
        ):
            raise _spec_error(
                "gcp.zone", zone,
                f"flex-start does not take {accel} there; use {next(iter(FLEX_ZONES_GOOD))} "
                "(set TPUSERVE_ZONE)",
                f"{FLEX_ZONES_BAD[zone]}: the API answered 'FLEX_START provisioning model is "
                f'not supported for accelerator type "{accel}"\'',
            )
        return self

    @property
    def node_name(self) -> str:
        return f"tpuserve-{self.name}"

    @property
    def network_tag(self) -> str:
        return f"tpuserve-{self.name}"

    # Long-lived resources are named for the deployment, not the stack: a shared base will
    # hold them (ARCHITECTURE "Conventions").
    @property
    def creates_network(self) -> bool:
        return self.gcp.network is None

    @property
    def network_name(self) -> str:
        return self.gcp.network or f"{self.gcp.deployment}-net"

    @property
    def subnet_name(self) -> str | None:
        """The subnet the project creates; None when the user brings a network."""
        return f"{self.gcp.deployment}-net-{self.gcp.region}" if self.creates_network else None

    @property
    def has_billing_guard(self) -> bool:
        return self.stack.provisioning_model != "flex" and self.stack.max_run_hours > 0

    @property
    def guard_service_account_id(self) -> str:
        return f"{self.gcp.deployment}-guard"

    @property
    def guard_service_account_email(self) -> str:
        return f"{self.guard_service_account_id}@{self.gcp.project}.iam.gserviceaccount.com"

    @property
    def guard_queue(self) -> str:
        """The Cloud Tasks queue holding each node's deletion task (in the zone's region)."""
        return (f"projects/{self.gcp.project}/locations/{self.gcp.region}/queues/"
                f"{self.gcp.deployment}-guard")

    @property
    def node_path(self) -> str:
        return f"projects/{self.gcp.project}/locations/{self.gcp.zone}/nodes/{self.node_name}"

    # Names carry the stack name so the three stacks can live side by side in one project.
    @property
    def service_account_id(self) -> str:
        return f"tpuserve-{self.name}-vm"

    @property
    def service_account_email(self) -> str:
        return f"{self.service_account_id}@{self.gcp.project}.iam.gserviceaccount.com"

    @property
    def hf_token_secret_id(self) -> str:
        return f"tpuserve-{self.name}-hf-token"

    @property
    def api_key_secret_id(self) -> str:
        return f"tpuserve-{self.name}-api-key"

    @property
    def cache_bucket(self) -> str:
        # Bucket names are global: the project id makes it unique.
        return f"{self.gcp.project}-tpuserve-{self.name}-xla-cache"

    @property
    def usd_per_hour(self) -> float:
        return getattr(self.pricing, self.stack.provisioning_model) * self.tpu.chips

    @property
    def labels(self) -> dict[str, str]:
        return {
            "stack": self.name,
            "model": re.sub(r"[^a-z0-9_-]", "-", self.vllm.model.lower())[:63],
            "provisioning-model": self.stack.provisioning_model,
            "managed-by": "tpuserve",
        }


class ConfigError(Exception):
    """Every problem found in the configuration, gathered so the user sees them at once."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_raw(
    path: Path = DEFAULT_CONFIG, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The default TOML, with TPUSERVE_CONFIG's file and TPUSERVE_PROJECT/ZONE merged over."""
    env = os.environ if environ is None else environ
    raw = _read_toml(path, "the default config")
    if user := env.get("TPUSERVE_CONFIG"):
        raw = deep_merge(raw, _read_toml(Path(user), "TPUSERVE_CONFIG"))
    for var, key in (("TPUSERVE_PROJECT", "project"), ("TPUSERVE_ZONE", "zone")):
        if value := env.get(var):
            raw = deep_merge(raw, {"gcp": {key: value}})
    return raw


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file as a dict; an unreadable or malformed file is a ConfigError, not a traceback."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{what} = {shown(str(path))}: cannot be read ({exc})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{what} = {shown(str(path))}: not valid TOML ({exc})"]) from None


def _format_error(stack: str, err: Mapping[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and " = " in msg.split(":", 1)[0]:
        return f"[{stack}] {msg}"  # our own rule: it already names setting and value
    # A key the user wrote is part of the location: shown like a value unless it is a plain word.
    where = ".".join(
        str(p) if re.fullmatch(r"[A-Za-z0-9_\[\]-]{1,64}", str(p)) else shown(p)
        for p in err["loc"]
    ) or "(top level)"
    value = err.get("input")
    text = "" if isinstance(value, Mapping) else f" = {shown(value)}"
    return f"[{stack}] {where}{text}: {msg}{_type_hint(err['type'], value)}"


def _type_hint(kind: str, value: object) -> str:
    """Strict types: say how TOML spells the wanted type."""
    if kind in ("int_type", "bool_type", "float_type", "finite_number") and isinstance(value, str):
        return " (TOML has types: write the value without quotes, e.g. 8000 or true)"
    if kind == "bool_type":
        return " (TOML has types: a boolean is true or false)"
    if kind == "int_type":
        return " (TOML has types: an integer has no decimal point and is not true/false)"
    if kind == "string_type":
        return " (TOML has types: a string is quoted)"
    return ""


# Keys the loader sets itself: the stack's name (from its [stacks.NAME] table) and the stack's
# own settings (gathered from that table into `stack`). A user who writes them is refused.
LOADER_KEYS = ("name", "stack")


def _stack_tables(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Mapping[str, Any]]:
    """The [stacks.NAME] tables; what is not a table is a problem, not a traceback."""
    stacks = raw.get("stacks", {})
    if not isinstance(stacks, Mapping):
        problems.append(
            f"stacks = {shown(stacks)}: must be a table of stacks, [stacks.spot] ... "
            f"(the stacks are {list(STACK_NAMES)})"
        )
        return {}
    unknown = ", ".join(sorted(shown(k) for k in set(stacks) - set(STACK_NAMES)))
    if unknown:
        problems.append(f"stacks: unknown stack(s) {unknown}; the stacks are {list(STACK_NAMES)}")
    out: dict[str, Mapping[str, Any]] = {}
    for name in STACK_NAMES:
        if name not in stacks:
            continue
        table = stacks[name]
        if not isinstance(table, Mapping):
            problems.append(f"[{name}] stacks.{name} = {shown(table)}: must be a table")
            continue
        out[name] = table
    return out


def _loader_keys_written(raw: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]],
                         ) -> list[str]:
    why = {"name": "the [stacks.NAME] table names the stack",
           "stack": "a stack's settings go directly in its [stacks.NAME] table"}
    found = [(key, key) for key in LOADER_KEYS if key in raw]
    found += [(f"stacks.{n}.{key}", key) for n, t in tables.items() for key in LOADER_KEYS
              if key in t]
    return [f"{where}: set by the loader itself ({why[key]}); remove it" for where, key in found]


def validate(raw: Mapping[str, Any]) -> tuple[dict[str, Deployment], list[str]]:
    """Validate every stack of a raw config: the stacks that passed, and every problem found."""
    problems: list[str] = []
    out: dict[str, Deployment] = {}
    stacks = _stack_tables(raw, problems)
    problems.extend(_loader_keys_written(raw, stacks))
    if problems:
        return out, problems
    shared = {k: v for k, v in raw.items() if k != "stacks"}
    for name, table in stacks.items():
        over = dict(table)
        stack_keys = {k: over.pop(k) for k in list(over) if k in StackSettings.model_fields}
        data = deep_merge(shared, over) | {"name": name, "stack": stack_keys}
        try:
            out[name] = Deployment.model_validate(data)
        except ValidationError as exc:
            problems.extend(_format_error(name, e) for e in exc.errors())
    return out, problems


def build_deployments(raw: Mapping[str, Any]) -> dict[str, Deployment]:
    """Validate every stack of a raw config; raise ConfigError listing every problem."""
    out, problems = validate(raw)
    if problems:
        raise ConfigError(merge_stacks(problems))
    return out


def merge_stacks(problems: list[str]) -> list[str]:
    """A shared setting fails in every stack: say it once, naming the stacks."""
    by_msg: dict[str, list[str]] = {}
    for p in problems:
        stack, _, msg = p.partition("] ")
        if not p.startswith("[") or not msg:  # a problem of the file, not of a stack
            by_msg.setdefault(p, [])
            continue
        by_msg.setdefault(msg, []).append(stack.lstrip("["))
    return [f"[{', '.join(stacks)}] {msg}" if stacks else msg for msg, stacks in by_msg.items()]


def load_deployments(environ: Mapping[str, str] | None = None) -> dict[str, Deployment]:
    return build_deployments(load_raw(environ=environ))


def shared_resource_warnings(deployments: Mapping[str, Deployment]) -> list[str]:
    """Stacks that would each create one of the deployment's long-lived resources.

    The network and the billing guard's identity and queue are named for the deployment, but
    until a shared base holds them each stack declares them in its own Terraform state: a
    second such stack of one deployment and project fails with 409 "already exists"."""
    owners: dict[str, list[str]] = {}
    for name, d in deployments.items():
        if d.creates_network:
            owners.setdefault(f"network {d.network_name} in project {d.gcp.project}",
                              []).append(name)
        if d.has_billing_guard:
            owners.setdefault(f"billing-guard account and queue {d.guard_service_account_id} "
                              f"in project {d.gcp.project}", []).append(name)
    return [
        f"stacks {', '.join(names)} each create the {what}: deploy one of them at a time, or "
        "give each its own `[stacks.NAME.gcp] deployment`"
        for what, names in owners.items() if len(names) > 1
    ]


def deployment_warnings(d: Deployment) -> list[str]:
    """Soft rules of the settings themselves (capacity ones: tpuserve.settings.loader)."""
    v = d.vllm
    out: list[str] = []
    if v.kv_cache_dtype in KV_DTYPES_FP8:
        out.append(
            f"vllm.kv_cache_dtype = {v.kv_cache_dtype!r}: buys 1.000x KV capacity at ~2% lower "
            "throughput (SPEC 4: the word-aligned block layout keeps 5,021 blocks); prefer auto"
        )
    mnbt = v.max_num_batched_tokens
    if mnbt & (mnbt - 1):
        bucket = 1 << (mnbt - 1).bit_length()
        out.append(
            f"vllm.max_num_batched_tokens = {mnbt}: not a power of two, it compiles as the "
            f"{bucket} bucket anyway (SPEC 4: 2496 compiled the 4096 ladder and cost -24.7% "
            "throughput at 8k/64); use a power of two"
        )
    if v.tensor_parallel_size > 1:
        out.append(
            f"vllm.tensor_parallel_size = {v.tensor_parallel_size}: the model has "
            f"{MODEL_KV_HEADS} KV head, padded to a multiple of TP, so KV memory is paid "
            f"{v.tensor_parallel_size}x for one replicated head (SPEC 4)"
        )
    if v.gpu_memory_utilization > GPU_MEM_CEILING:
        out.append(
            f"vllm.gpu_memory_utilization = {v.gpu_memory_utilization}: untested above "
            "0.92 (SPEC 4: estimated margins ~291 MB at 0.93, ~127 MB at 0.94; 0.95 died)"
        )
    if v.max_num_seqs is not None:
        out.append(
            f"vllm.max_num_seqs = {v.max_num_seqs}: capping it was worse in every measured "
            "cell (SPEC 4: 64 vs the default 256); leave it unset"
        )
    if d.stack.provisioning_model != "flex" and d.stack.max_run_hours == 0:
        monthly = d.usd_per_hour * 730
        out.append(
            f"stack.max_run_hours = 0: the billing guard is off; {d.stack.provisioning_model} "
            f"bills ${d.usd_per_hour:.4f}/h until deleted, ${monthly:,.0f} a month (SPEC 7)"
        )
    if d.gcp.network is not None and d.gcp.network.rsplit("/", 1)[-1] == "default":
        out.append(
            "gcp.network = 'default': its pre-made rules (default-allow-ssh, -rdp, -icmp from "
            "0.0.0.0/0) apply to the node and its external IP next to tpuserve's own; unset "
            "gcp.network to let tpuserve create a network whose only rules are its own"
        )
    if not d.access.api_key_proxy and any(
        ipaddress.ip_network(r).prefixlen == 0 for r in d.access.api_source_ranges
    ):
        out.append(
            "access.api_key_proxy = false with port "
            f"{d.vllm.port} open to {d.access.api_source_ranges}: /metrics, /tokenize and /v1 "
            "are reachable by anyone; keep the proxy or front the node with your own gateway"
        )
    if d.access.api_source_ranges and not d.access.tls_on:
        why = ("access.tls = 'off'" if d.access.api_key_proxy
               else "access.api_key_proxy = false (the proxy terminates TLS)")
        out.append(
            f"{why} with port {d.vllm.port} open to {d.access.api_source_ranges}: the API key "
            "and every prompt and answer cross the network in clear text; keep the proxy and "
            "access.tls = 'self-signed' (the default)"
        )
    if d.stack.provisioning_model == "flex" and d.gcp.zone not in FLEX_ZONES_GOOD:
        good = ", ".join(f"{z} ({why})" for z, why in FLEX_ZONES_GOOD.items())
        out.append(
            f"gcp.zone = {d.gcp.zone!r}: flex-start acceptance of {d.tpu.accelerator_type} is "
            f"unknown there (known good: {good}); a create that is refused fails at deploy "
            "(SPEC 2: quota in a zone says nothing about whether flex-start is accepted)"
        )
    if d.tpu.accelerator_type != "v5litepod-1":
        out.append(
            f"tpu.accelerator_type = {d.tpu.accelerator_type!r}: every figure in SPEC was "
            "measured on v5litepod-1"
        )
    return out
