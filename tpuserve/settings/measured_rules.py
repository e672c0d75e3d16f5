"""Every measured rule of the settings, one object each: what it guards and why, told once.

A Rule names its setting, its level (an error refuses the value, a warning is printed at synth,
a note only explains the setting to a reviewer), the check, the rule in words and the
measurement behind it. The validators (settings/vllm.py, settings/sections.py) raise
`Rule.text`, synth's warnings (settings/warnings.py) print it, the review's flag notes
(settings/flag_rules.py) show a setting's note, and docs/configuration.md is generated from
the same objects (tools/gen_config_reference.py). A rule's flag is spelled on its setting
(`Flag` in the field's metadata), or on the note for a name that is no setting's flag.

Messages read `SETTING = VALUE: WORDS (MEASUREMENT); ADVICE`. In words, measurement and advice
of errors and warnings, `{value}` and the names a rule's `fields` returns are filled in.
Pure data and string formatting: imports only the measured facts and the accelerator table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tpuserve.accelerators import (
    ACCELERATORS,
    MEASURED_ACCELERATOR,
    V5E_PAGE,
    V6E,
    V6E_PAGE,
    multi_host,
)
from tpuserve.facts import (
    COLD_START_S,
    E2B_MEASURED_TPOT_MS,
    GPU_MEM_CEILING,
    GPU_MEM_FATAL,
    GPU_MEM_FATAL_BOOT_S,
    KV_DTYPES_FATAL,
    KV_DTYPES_FP8,
    KV_DTYPES_OK,
    KV_DTYPES_UNTESTED,
    MM_ITEM_TOKENS,
    MODEL_KV_HEADS,
    PRICES_USD_PER_CHIP_HOUR,
    WARM_START_S,
)
from tpuserve.kinds import PRICE_KEYS
from tpuserve.settings.model_profiles import DEFAULT_MODEL
from tpuserve.settings.string_rules import shown

Level = Literal["error", "warning", "note"]
Check = Callable[[Any, Mapping[str, Any]], bool]

# SPEC 1: the model every figure was measured on.
MEASURED_MODEL = "google/gemma-4-E2B-it"

# The positional model argument of `vllm serve MODEL` is reported under this name; the
# container image (not an argument, but it decides the compiled programs) under "image".
MODEL_ARG = "model"


@dataclass(frozen=True)
class Flag:
    """Field metadata: the `vllm serve` option a setting renders to (tpuserve/render/
    vllm_args.py renders every flagged field in declaration order; `after` moves one)."""

    spelling: str
    after: str | None = None  # render right after this field's flag (SPEC 4's order)


@dataclass(frozen=True)
class Rule:
    """One measured rule of one setting: an error, a warning, or a note that only explains."""

    setting: str  # the dotted setting path it guards, e.g. vllm.gpu_memory_utilization
    level: Level
    words: str  # the rule as the user reads it
    measurement: str = ""  # the "SPEC n" citation and figure behind it
    advice: str = ""  # a warning's what-to-do, after the measurement
    broken: Check | None = None  # (value, the section's other values) -> the rule is broken
    fields: Callable[[Any], Mapping[str, object]] | None = None  # more names for the words
    before: bool = False  # checks the raw input, before the type's own check
    flag: str | None = None  # a note's name when it is not its setting's own flag

    @property
    def section(self) -> str:
        return self.setting.rpartition(".")[0]

    @property
    def field(self) -> str:
        return self.setting.rpartition(".")[2]

    def text(self, value: object) -> str:
        """The one line the user reads for this value."""
        names = {"value": value, **(self.fields(value) if self.fields else {})}
        out = f"{self.setting} = {shown(value)}: {self.words.format(**names)}"
        if self.measurement:
            out += f" ({self.measurement.format(**names)})"
        return out + (f"; {self.advice.format(**names)}" if self.advice else "")

    @property
    def note(self) -> str:
        """A note's text, as the review prints it beside a changed flag."""
        return f"{self.words} ({self.measurement})"

    def applies(self, value: object, others: Mapping[str, Any]) -> bool:
        return self.broken is not None and self.broken(value, others)


def _mm_floor_applies(v: int, o: Mapping[str, Any]) -> bool:
    limits = o.get("limit_mm_per_prompt") or {}
    return bool(o.get("disable_chunked_mm_input") and any(limits.values())
                and v < MM_ITEM_TOKENS)


def _fullmatch(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)
    return lambda v: compiled.fullmatch(v) is not None


# SPEC 1: the TPU API's names of v5e slices, and the prose spelling it refuses.
_V5E_PROSE = _fullmatch(r"v5e-[0-9]+")
# The accelerator table (tpuserve/accelerators.py): what serves, in the TPU API's spelling.
_SINGLE_HOST = ", ".join(ACCELERATORS)

# $/chip-hour bound: SPEC 2's list prices are 0.58-1.20; 100 catches a price typed per month
# or in cents without refusing any real TPU price.
MAX_USD_PER_CHIP_HOUR = 100.0


def _price_out_of_range(v: object, o: Mapping[str, Any]) -> bool:
    # Raw input: a number out of range gets this rule; a string the type's own message.
    return isinstance(v, int | float) and not isinstance(v, bool) and not (
        0 < v <= MAX_USD_PER_CHIP_HOUR)


# SPEC 4: what killed the server above the measured ceiling.
_GPU_MEM_DIED = (f"{GPU_MEM_FATAL} died {GPU_MEM_FATAL_BOOT_S} s into boot with "
                 "RuntimeProgramAllocationFailure")
# SPEC 4: the compiled programs (structured decoding included) live outside the cap.
_OUTSIDE_CAP = "1.26 GiB outside the cap"

# In this order: synth prints a section's warnings in it.
RULES: tuple[Rule, ...] = (
    # --------------------------------------------------------------------------- [vllm]
    Rule("vllm.model", "note",
         "google/gemma-4-E2B-it in bf16 is what every SPEC figure was measured on", "SPEC 1",
         flag=MODEL_ARG),
    Rule("vllm.image", "note",
         "pin a tag or a manifest digest (repo@sha256:...); the measured build was "
         "vllm/vllm-tpu:nightly, vLLM 0.26.1rc1.dev125", "SPEC 1", flag="image"),
    Rule("vllm.dtype", "note",
         "bfloat16 only: w4a16, mxfp4, int8/int4 PTQ, AWQ and GGUF do not boot on the JAX path",
         "SPEC 4"),
    Rule("vllm.dtype", "error", "only bfloat16 is supported",
         "SPEC 4: weights quantization is bf16 only; w4a16, mxfp4, int8/int4 PTQ, AWQ and "
         "GGUF do not boot on the JAX path",
         broken=lambda v, o: v != "bfloat16", before=True),
    Rule("vllm.kv_cache_dtype", "note",
         "auto (bf16): fp8 buys 1.000x KV capacity at ~2% lower throughput; "
         "int8_per_token_head, nvfp4 and turboquant_* kill the server at boot", "SPEC 4"),
    Rule("vllm.kv_cache_dtype", "error", "not a vLLM choice",
         "SPEC 4: rejected by the CLI enum: invalid choice: 'int8'",
         broken=lambda v, o: v == "int8"),
    Rule("vllm.kv_cache_dtype", "error", "use auto (bf16) or an fp8 variant",
         "SPEC 4: accepted by the CLI, then kills the server at boot on this build",
         broken=lambda v, o: v in KV_DTYPES_FATAL or v.startswith("turboquant_")),
    Rule("vllm.kv_cache_dtype", "error", "untested on this build; use auto",
         "SPEC 4: accepted by the CLI but never booted; its siblings int8_per_token_head and "
         "nvfp4 kill the server at boot",
         broken=lambda v, o: v in KV_DTYPES_UNTESTED),
    Rule("vllm.kv_cache_dtype", "error", "unknown; use auto",
         "SPEC 4: auto, bfloat16 and fp8/fp8_e4m3/fp8_e5m2 are the values that boot",
         broken=lambda v, o: v not in KV_DTYPES_OK | KV_DTYPES_FP8),
    Rule("vllm.kv_cache_dtype", "warning", "buys 1.000x KV capacity at ~2% lower throughput",
         "SPEC 4: the word-aligned block layout keeps 5,021 blocks", "prefer auto",
         broken=lambda v, o: v in KV_DTYPES_FP8),
    Rule("vllm.max_model_len", "note",
         "the backend keeps 512 blocks per request: 16384 -> block 32, 10,043 blocks; "
         "32768 -> block 64, 5,021 blocks; doubling it costs no KV capacity", "SPEC 4"),
    Rule("vllm.max_num_batched_tokens", "note",
         "4096: TPU compiles a power-of-two ladder and rounds up (2496 cost -24.7% at 8k/64); "
         f"multimodal input needs >= {MM_ITEM_TOKENS} or boot fails", "SPEC 4"),
    Rule("vllm.max_num_batched_tokens", "error",
         f"must be >= {MM_ITEM_TOKENS} while disable_chunked_mm_input is on with multimodal "
         "inputs (4096 recommended); a text-only deployment may set limit_mm_per_prompt to "
         "zeros and drop disable_chunked_mm_input",
         "SPEC 4: the server fails at boot with 'ValueError: Chunked MM input disabled but "
         f"max_tokens_per_mm_item ({MM_ITEM_TOKENS}) is larger than max_num_batched_tokens "
         "({value}). Please increase max_num_batched_tokens.'",
         broken=_mm_floor_applies),
    Rule("vllm.max_num_batched_tokens", "warning",
         "not a power of two, it compiles as the {bucket} bucket anyway",
         "SPEC 4: 2496 compiled the 4096 ladder and cost -24.7% throughput at 8k/64",
         "use a power of two",
         broken=lambda v, o: bool(v & (v - 1)),
         fields=lambda v: {"bucket": 1 << (v - 1).bit_length()}),
    Rule("vllm.tensor_parallel_size", "note",
         "1 on one chip: the single KV head is padded to a multiple of TP, so TP=4 pays 4x KV "
         "memory", "SPEC 4"),
    Rule("vllm.tensor_parallel_size", "warning",
         f"the model has {MODEL_KV_HEADS} KV head, padded to a multiple of TP, so KV memory is "
         "paid {value}x for one replicated head", "SPEC 4",
         "a model that fits one chip serves cheaper as replicas of a one-chip slice on the fleet",
         # Measured on this model only; another model's KV heads are its geometry's
         # (settings/capacity.py's derived warning).
         broken=lambda v, o: v is not None and v > 1 and o.get("model") == MEASURED_MODEL),
    Rule("vllm.gpu_memory_utilization", "note",
         f"{GPU_MEM_CEILING} is the ceiling: it governs weights + KV only; {_GPU_MEM_DIED}, "
         "twice", "SPEC 4"),
    Rule("vllm.gpu_memory_utilization", "error", f"must be <= {GPU_MEM_CEILING}",
         f"SPEC 4: {_GPU_MEM_DIED} (compiled XLA programs need the 1.26 GiB left outside the "
         "cap), twice",
         broken=lambda v, o: v >= GPU_MEM_FATAL),
    Rule("vllm.gpu_memory_utilization", "error",
         f"must be <= {GPU_MEM_CEILING}; 0.93-0.94 need "
         "allow_untested_gpu_memory_utilization = true",
         f"SPEC 4: {GPU_MEM_CEILING} is the measured ceiling, 0.93/0.94 are untested "
         f"(estimated margins ~291 MB / ~127 MB), {GPU_MEM_FATAL} died at boot",
         broken=lambda v, o: v > GPU_MEM_CEILING and not o.get(
             "allow_untested_gpu_memory_utilization")),
    Rule("vllm.gpu_memory_utilization", "warning", f"untested above {GPU_MEM_CEILING}",
         "SPEC 4: estimated margins ~291 MB at 0.93, ~127 MB at 0.94; "
         f"{GPU_MEM_FATAL} died",
         broken=lambda v, o: v > GPU_MEM_CEILING),
    Rule("vllm.max_num_seqs", "note",
         "leave the default 256: capping at 64 was worse in every measured cell", "SPEC 4"),
    Rule("vllm.max_num_seqs", "warning", "capping it was worse in every measured cell",
         "SPEC 4: 64 vs the default 256", "leave it unset",
         broken=lambda v, o: v is not None),
    Rule("vllm.kv_cache_memory_bytes", "note",
         "the KV pool in bytes instead of the fraction; skips memory profiling on later boots; "
         "measured-good 5923602432", "SPEC 4"),
    Rule("vllm.block_size", "note",
         "never set it: the backend's 512 blocks per request decode at "
         f"{E2B_MEASURED_TPOT_MS} ms TPOT, a misconfigured 2048 at 8.32 ms", "SPEC 4"),
    Rule("vllm.block_size", "error", "never set it; the backend picks it from max_model_len",
         "SPEC 4: a misconfigured 2048 blocks per request decoded at 8.32 ms TPOT against "
         f"{E2B_MEASURED_TPOT_MS} ms for the backend's own 512",
         broken=lambda v, o: v is not None),
    Rule("vllm.enable_prefix_caching", "note",
         "on in the measured serving command: requests sharing a prefix reuse KV blocks",
         "SPEC 4"),
    Rule("vllm.disable_chunked_mm_input", "note",
         f"the multimodal contract: with image 4 / audio 1 one item needs {MM_ITEM_TOKENS} "
         "batched tokens; a text-only deployment may drop it", "SPEC 4"),
    Rule("vllm.limit_mm_per_prompt", "note",
         '{"image":4,"audio":1} with --disable-chunked-mm-input sets the '
         f"{MM_ITEM_TOKENS}-token floor of max-num-batched-tokens", "SPEC 4"),
    Rule("vllm.enable_auto_tool_choice", "note",
         "OpenAI-compatible tool calling; its structured-decoding programs are paid from the "
         f"{_OUTSIDE_CAP}", "SPEC 4"),
    Rule("vllm.tool_call_parser", "note",
         "gemma4: OpenAI-compatible tool calling; structured-decoding programs live in the "
         f"{_OUTSIDE_CAP}", "SPEC 4"),
    Rule("vllm.reasoning_parser", "note",
         "gemma4: separates reasoning from the answer; its programs share the "
         f"{_OUTSIDE_CAP}", "SPEC 4"),
    Rule("vllm.speculative_config", "note",
         "untried: n-gram drafting needs no draft checkpoint; never booted on the pinned "
         "image, so it needs allow_untested_speculative_config", "SPEC 4"),
    Rule("access.api_key_proxy", "note",
         "loopback behind the API-key proxy, 0.0.0.0 without it: vLLM's --api-key guards only "
         "/v1", "README, Access", flag="--host"),
    Rule("vllm.port", "note",
         "8000 is the public OpenAI-compatible port; vLLM moves to 8001 behind the API-key "
         "proxy", "SPEC 1", flag="--port"),
    # ---------------------------------------------- [vllm.env] (tpu-inference, SPEC 4 table)
    Rule("vllm.env.ATTN_BUCKETIZED_NUM_REQS", "note",
         "off by default: precompiles attention at power-of-two request buckets instead of one "
         "shape at max_num_seqs", "SPEC 4"),
    Rule("vllm.env.SLICE_ROPE_CACHE", "note",
         "off by default: slices the rotary cache to max_model_len at load, freeing HBM",
         "SPEC 4"),
    Rule("vllm.env.NUM_PRECOMPILE_WORKERS", "note",
         "1 by default: parallel XLA precompilation; compilation is 685 of the "
         f"{COLD_START_S:.0f} s cold start", "SPEC 4"),
    Rule("vllm.env.VLLM_TPU_BUCKET_PADDING_GAP", "note",
         "0 by default (powers of two); 128 gives linear bucket steps, untested and plausibly "
         "better", "SPEC 4"),
    Rule("vllm.env.VLLM_XLA_CHECK_RECOMPILATION", "note",
         "off by default: errors on a runtime recompilation; turn on for a validation boot",
         "SPEC 4"),
    # The container's fixed variables (tpuserve/render/vllm_args.py): no setting moves them.
    Rule("(fixed)", "note",
         "/dev/shm: the 9.54 GiB checkpoint downloads into shared memory in ~10 s", "SPEC 4",
         flag="HF_HOME"),
    Rule("(fixed)", "note",
         "the token is a read-only file from Secret Manager, never -e HF_TOKEN=value", "SPEC 3",
         flag="HF_TOKEN_PATH"),
    # --------------------------------------------------------------------------- [pricing]
    *(Rule(f"pricing.{model}", "error",
           f"must be a finite $/chip-hour above 0 and at most {MAX_USD_PER_CHIP_HOUR:g}",
           "SPEC 2: list prices are 0.58-1.20 $/chip-hour; a larger number is a price per "
           "month or in cents, and every cost figure would be wrong",
           broken=_price_out_of_range, before=True)
      for model in PRICES_USD_PER_CHIP_HOUR if model in PRICE_KEYS),  # [pricing]'s order
    # --------------------------------------------------------------------------- [tpu]
    Rule("tpu.accelerator_type", "error", "spell it 'v5litepod-{n}'",
         "SPEC 1: 'v5e-N' is prose; the TPU API only accepts v5litepod-N",
         broken=lambda v, o: _V5E_PROSE(v), fields=lambda v: {"n": v.split("-")[1]}),
    Rule("tpu.accelerator_type", "error",
         "a multi-host slice: one vLLM server serves from one host's chips; use one of "
         f"{_SINGLE_HOST}, or replicas on the fleet",
         "vendor: 8 chips per {family} host, {page}",
         broken=lambda v, o: multi_host(v) is not None,
         fields=lambda v: {"family": getattr(multi_host(v), "name", ""),
                           "page": V6E_PAGE if multi_host(v) is V6E else V5E_PAGE}),
    Rule("tpu.accelerator_type", "error", f"not a single-host v5e or v6e slice: {_SINGLE_HOST}",
         "SPEC 1 for v5litepod-1; the TPU API's names of the rest, docs/accelerators.md",
         broken=lambda v, o: v not in ACCELERATORS),
    Rule("tpu.accelerator_type", "warning",
         "every figure in SPEC was measured on v5litepod-1",
         broken=lambda v, o: v != "v5litepod-1"),
    # --------------------------------------------------------------------------- [fleet]
    Rule("fleet.scale_up_period_s", "error", f"must be at least {WARM_START_S:.0f}",
         f"SPEC 4: a new replica serves {WARM_START_S:.0f} s (warm) to {COLD_START_S:.0f} s "
         "(cold) after it starts; adding another before the last one serves buys chips that "
         "answer the same queue twice",
         broken=lambda v, o: v < WARM_START_S),
    Rule("fleet.scale_down_window_s", "error", f"must be at least {WARM_START_S:.0f}",
         f"SPEC 4: a replica removed in a dip takes {WARM_START_S:.0f}-{COLD_START_S:.0f} s to "
         "come back; a shorter window flaps",
         broken=lambda v, o: v < WARM_START_S),
)



def rules_of(setting: str, level: Level | None = None) -> Iterator[Rule]:
    """The setting's rules in their order, of one level or all."""
    return (r for r in RULES if r.setting == setting and level in (None, r.level))


def checked_fields(section: str, *, before: bool) -> tuple[str, ...]:
    """The fields of a section an error rule guards (the validators hook on these)."""
    names = [r.field for r in RULES
             if r.level == "error" and r.section == section and r.before == before]
    return tuple(dict.fromkeys(names))


# Error rules measured on Gemma 4 E2B whose limit is the model's own: for another model they
# still hold (fail closed) but as derived limits, with the margin stated.
MODEL_SIDE_MARGINS: Mapping[str, str] = {
    "vllm.max_num_batched_tokens": (f"the floor is E2B's {MM_ITEM_TOKENS} tokens per multimodal "
                                    "item; this model's own item size may be larger or smaller"),
}


# Error rules measured on v5litepod-1 whose limit is the chip's: on another slice they still
# hold (fail closed) as derived limits. 0.92 is the highest value ever seen to boot, so it
# caps every chip (docs/accelerators.md); settings/accelerator_rules.py derives a lower one.
CHIP_SIDE_MARGINS: Mapping[str, str] = {
    "vllm.gpu_memory_utilization": (
        f"the cap measured on {MEASURED_ACCELERATOR} (SPEC 4), applied as a derived limit: "
        f"{GPU_MEM_CEILING} is the highest value seen to boot, and this chip's own ceiling "
        "is not measured (allow_untested_gpu_memory_utilization does not lift it here)"),
}
# The validation context's key (rule_context): the deployment's accelerator type.
ACCELERATOR_KEY = "accelerator_type"


def rule_context(raw: Mapping[str, Any]) -> dict[str, object]:
    """The validation context a deployment's sections are checked in: its raw accelerator
    type (a chip-side rule is labelled derived off the measured chip)."""
    tpu = raw.get("tpu")
    accel = tpu.get(ACCELERATOR_KEY) if isinstance(tpu, Mapping) else None
    return {ACCELERATOR_KEY: accel if isinstance(accel, str) else MEASURED_ACCELERATOR}


def enforce(setting: str, value: Any, others: Mapping[str, Any],
            context: Mapping[str, Any] | None = None) -> Any:
    """`value`, or a ValueError with the first error rule of the setting it breaks; labelled
    derived for another model (a model-side limit) or another chip (a chip-side one)."""
    for rule in rules_of(setting, "error"):
        if rule.applies(value, others):
            text, model = rule.text(value), others.get("model")
            if setting in MODEL_SIDE_MARGINS and isinstance(model, str) \
                    and model != DEFAULT_MODEL:
                text += (f" [derived for {model}: measured for Gemma 4 E2B on v5litepod-1; "
                         f"margin: {MODEL_SIDE_MARGINS[setting]}]")
            accel = (context or {}).get(ACCELERATOR_KEY)
            if setting in CHIP_SIDE_MARGINS and isinstance(accel, str) \
                    and accel != MEASURED_ACCELERATOR:
                text += f" [derived for {accel}: {CHIP_SIDE_MARGINS[setting]}]"
            raise ValueError(text)
    return value


def warnings_of(section: str, values: Mapping[str, Any]) -> list[str]:
    """The warnings a section's values earn, in RULES' order."""
    return [r.text(values[r.field]) for r in RULES
            if r.level == "warning" and r.section == section
            and r.applies(values[r.field], values)]
