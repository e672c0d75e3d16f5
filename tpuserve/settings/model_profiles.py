"""The serving flags that depend on the model, per (model, accelerator, image) with sources.

Tool-call and reasoning parsers and the multimodal limits (which, with disable_chunked_mm_input,
set the chunked-multimodal floor of max_num_batched_tokens) are the model's, not the
server's: a model other than Gemma 4 E2B never inherits E2B's `gemma4` parsers. A profile keyed
by a model alone (accelerator and image None) applies to any accelerator and image, as derived.
A model without a profile gets no parsers (enable_auto_tool_choice off: vLLM needs a parser for
it) and text-only limits (no --limit-mm-per-prompt, and no --disable-chunked-mm-input: vLLM's
scheduler option only changes how multimodal items are scheduled, so a text-only model has no
multimodal floor); `plan` says so. A setting the user writes wins over any profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "google/gemma-4-E2B-it"
PROFILE_FIELDS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser",
                  "limit_mm_per_prompt")


@dataclass(frozen=True)
class Profile:
    model: str
    accelerator: str | None  # None: any accelerator (derived)
    image: str | None  # None: any image (derived)
    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)


E2B_MEASURED = Profile(
    DEFAULT_MODEL, "v5litepod-1", "vllm/vllm-tpu:nightly",
    {"enable_auto_tool_choice": True, "tool_call_parser": "gemma4",
     "reasoning_parser": "gemma4", "limit_mm_per_prompt": {"image": 4, "audio": 1}},
    dict.fromkeys(PROFILE_FIELDS, "measured SPEC 3-4 (Gemma 4 E2B, v5litepod-1, "
                  "vllm/vllm-tpu:nightly: tool call checked, multimodal contract booted)"),
)
# Derived: the parsers the model's publishers and vLLM document, never booted here.
QWEN3_DERIVED = Profile(
    "Qwen/Qwen3-4B", None, None,
    {"enable_auto_tool_choice": True, "tool_call_parser": "hermes",
     "reasoning_parser": "qwen3", "limit_mm_per_prompt": {}},
    {"enable_auto_tool_choice": "derived: needed by --tool-call-parser",
     "tool_call_parser": "derived: Qwen's maintainers name `hermes` for vLLM "
     "(QwenLM/Qwen3 discussion 1098); not booted here",
     "reasoning_parser": "derived: vLLM's `qwen3` reasoning parser (<think> blocks); "
     "not booted here",
     "limit_mm_per_prompt": "derived: a text-only model (Qwen3ForCausalLM)"},
)
PROFILES: tuple[Profile, ...] = (E2B_MEASURED, QWEN3_DERIVED)
NO_PROFILE: Mapping[str, Any] = {"enable_auto_tool_choice": False, "tool_call_parser": None,
                                 "reasoning_parser": None, "limit_mm_per_prompt": {}}


def profile_for(model: str) -> Profile | None:
    """The model's profile whatever the accelerator and image (its values do not vary yet)."""
    return next((p for p in PROFILES if p.model == model), None)


def profile_source(model: str, accelerator: str, image: str) -> str:
    """How `plan` labels the profile of a deployment: measured only on its measured key."""
    p = profile_for(model)
    if p is None:
        return ("none: no profile for this model: no tool-call or reasoning parser, "
                "text-only limits (set vllm.tool_call_parser etc. to add them)")
    if (p.accelerator, p.image) == (accelerator, image):
        return f"measured for ({p.model}, {p.accelerator}, {p.image})"
    where = "any accelerator and image" if p.accelerator is None else \
        f"measured on ({p.accelerator}, {p.image}) only"
    return f"derived: profile of {p.model} ({where}); applied to ({accelerator}, {image})"


def with_profile(data: Mapping[str, Any]) -> dict[str, Any]:
    """A raw [vllm] table with the model's profile filled in where the user set nothing.

    limit_mm_per_prompt merges key by key over the profile's (so `{ image = 0 }` keeps audio),
    the way the default config's table used to merge; an empty table is text-only."""
    out = dict(data)
    model = out.get("model", DEFAULT_MODEL)
    p = profile_for(model) if isinstance(model, str) else None
    values = p.values if p is not None else NO_PROFILE
    # The default model's values are VllmSettings' defaults: only its table merges.
    names = ("limit_mm_per_prompt",) if model == DEFAULT_MODEL else PROFILE_FIELDS
    for name in names:
        if name == "limit_mm_per_prompt" and isinstance(out.get(name), Mapping) and out[name]:
            out[name] = {**values[name], **out[name]}
        elif name not in out:
            out[name] = values[name]
    # A text-only model (its profile, or none, has no multimodal item, and the user asked for
    # none): no --disable-chunked-mm-input, so no multimodal floor (SPEC 4's rule: "a
    # text-only deployment may drop it"). The default model keeps VllmSettings' default.
    if model != DEFAULT_MODEL and "disable_chunked_mm_input" not in out \
            and not has_mm_items(values["limit_mm_per_prompt"]) \
            and not has_mm_items(out.get("limit_mm_per_prompt")):
        out["disable_chunked_mm_input"] = False
    return out


def has_mm_items(limits: object) -> bool:
    """Whether a limit_mm_per_prompt table allows any multimodal item (a malformed one counts:
    its own validator refuses it)."""
    if not isinstance(limits, Mapping):
        return limits is not None
    return any(v != 0 for v in limits.values())
