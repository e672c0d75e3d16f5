"""The Hugging Face config.json fields the planner reads, validated strictly.

A geometry file is input from anywhere (`plan --model-config FILE`, capacity.model_geometry):
every field is a strict integer (JSON `true` is not 1, `35.0` is not 35) inside bounds far
above any published decoder, and the per-layer lists agree with num_hidden_layers, so the
planner's arithmetic never divides by zero, overflows a float or allocates per-layer tables
of absurd size. Problems come back as one line each: the field, the value, the rule.

The bounds are not measurements: they sit 4-60x above the largest open decoders (126 layers,
hidden 16,384, intermediate 53,248, 128 heads, head_dim 512, vocab 262,144), so they refuse
nonsense without refusing a real model.
"""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SLIDING = "sliding_attention"
FULL = "full_attention"

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 8192
MAX_HIDDEN = 1 << 18  # 262,144
MAX_INTERMEDIATE = 1 << 20
MAX_VOCAB = 1 << 24
MAX_WINDOW = 1 << 24  # tokens
# HF config.json files are a few KB (the E2B one is 1.6 KB); a bigger file is not one.
MAX_FILE_BYTES = 1 << 20

Layers = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
Heads = Annotated[int, Field(ge=1, le=MAX_HEADS)]
HeadDim = Annotated[int, Field(ge=1, le=MAX_HEAD_DIM)]
Hidden = Annotated[int, Field(ge=1, le=MAX_HIDDEN)]
Intermediate = Annotated[int, Field(ge=1, le=MAX_INTERMEDIATE)]
Vocab = Annotated[int, Field(ge=1, le=MAX_VOCAB)]
Window = Annotated[int, Field(ge=1, le=MAX_WINDOW)]
AttentionKind = Literal["sliding_attention", "full_attention"]


# The closed range of every bounded field, for messages that state the whole rule.
_RANGES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, MAX_LAYERS), "num_kv_shared_layers": (0, MAX_LAYERS),
    "sliding_window": (1, MAX_WINDOW), "sliding_window_pattern": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS), "num_key_value_heads": (1, MAX_HEADS),
    "num_global_key_value_heads": (1, MAX_HEADS), "head_dim": (1, MAX_HEAD_DIM),
    "global_head_dim": (1, MAX_HEAD_DIM), "hidden_size": (1, MAX_HIDDEN),
    "intermediate_size": (1, MAX_INTERMEDIATE), "vocab_size": (1, MAX_VOCAB),
    "vocab_size_per_layer_input": (1, MAX_VOCAB), "hidden_size_per_layer_input": (0, MAX_HIDDEN),
}


class GeometryError(ValueError):
    """A geometry file the planner cannot use; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class TextConfig(BaseModel):
    """The text decoder's fields; unknown keys (vision towers, rope, ...) are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    num_hidden_layers: Layers
    num_kv_shared_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = None
    layer_types: Annotated[list[AttentionKind], Field(max_length=MAX_LAYERS)] | None = None
    sliding_window: Window | None = None
    use_sliding_window: bool | None = None
    sliding_window_pattern: Layers | None = None
    num_attention_heads: Heads
    # HF's own default when absent: one KV head per query head (multi-head attention).
    num_key_value_heads: Heads | None = None
    num_global_key_value_heads: Heads | None = None
    # HF's own default when absent: hidden_size / num_attention_heads (must divide).
    head_dim: HeadDim | None = None
    global_head_dim: HeadDim | None = None
    hidden_size: Hidden
    intermediate_size: Intermediate | Annotated[list[Intermediate], Field(max_length=MAX_LAYERS)]
    vocab_size: Vocab
    vocab_size_per_layer_input: Vocab | None = None
    hidden_size_per_layer_input: Annotated[int, Field(ge=0, le=MAX_HIDDEN)] | None = None
    tie_word_embeddings: bool | None = None
    attention_k_eq_v: bool | None = None
    max_position_embeddings: Annotated[int, Field(ge=1, le=MAX_WINDOW)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "TextConfig":
        n = self.num_hidden_layers
        problems: list[str] = []
        if self.layer_types is not None and len(self.layer_types) != n:
            problems.append(f"layer_types has {len(self.layer_types)} entries: must have one "
                            f"per layer (num_hidden_layers = {n})")
        sizes = self.intermediate_size
        if isinstance(sizes, list) and len(sizes) != n:
            problems.append(f"intermediate_size has {len(sizes)} entries: a per-layer list must "
                            f"have one per layer (num_hidden_layers = {n})")
        if self.layer_types and SLIDING in self.layer_types and self.sliding_window is None:
            problems.append(f"sliding_window is required: layer_types has {SLIDING!r} layers")
        shared = self.num_kv_shared_layers or 0
        if shared >= n:
            problems.append(f"num_kv_shared_layers = {shared}: must be < num_hidden_layers "
                            f"({n}); at least one layer must own a KV cache")
        for name in ("num_key_value_heads", "num_global_key_value_heads"):
            kv = getattr(self, name)
            if kv is not None and self.num_attention_heads % kv:
                problems.append(f"{name} = {kv}: must divide num_attention_heads "
                                f"({self.num_attention_heads}); each KV head serves a whole "
                                "group of query heads")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            problems.append(f"head_dim is required: hidden_size ({self.hidden_size}) is not a "
                            f"multiple of num_attention_heads ({self.num_attention_heads})")
        if self.attention_k_eq_v:
            # Gemma 4 large models share K and V on full layers; not measured, not modelled.
            problems.append("attention_k_eq_v = true: not modelled by the planner")
        if problems:
            raise ValueError(" | ".join(problems))
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


# Fields of layouts whose cache is not K and V per head per token: the planner cannot size
# them from this arithmetic, so it refuses them by name rather than guess.
UNSIZED_FIELDS: dict[str, str] = {
    "kv_lora_rank": "latent attention (MLA: a compressed KV latent per token)",
    "q_lora_rank": "latent attention (MLA: a compressed KV latent per token)",
    "ssm_state_size": "state-space layers (a fixed state per sequence, not KV per token)",
    "mamba_d_state": "state-space layers (a fixed state per sequence, not KV per token)",
    "linear_attn_config": "linear attention (a fixed state per sequence, not KV per token)",
    "layers_block_type": "hybrid state-space/attention layers",
    "attn_layer_indices": "hybrid state-space/attention layers",
}


def unsized_problems(config: dict[str, Any], prefix: str = "") -> list[str]:
    """One line per field of a layout the planner does not size (latent, linear, SSM)."""
    return [f"{prefix}{name} = {_show(config[name])}: {what}: not sized by the planner "
            "(it sizes multi-head, grouped-query, multi-query, sliding and KV-shared layers)"
            for name, what in UNSIZED_FIELDS.items() if config.get(name) is not None]


class HfConfig(BaseModel):
    """A config.json: the decoder at top level, or nested under text_config (multimodal)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    text_config: dict[str, Any] | None = None
    tie_word_embeddings: bool | None = None
    max_position_embeddings: Annotated[int, Field(ge=1, le=MAX_WINDOW)] | None = None


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _rule(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in ("int_type", "int_parsing"):
        return "must be an integer (true, 35.0 and \"35\" are not)"
    if kind in ("greater_than_equal", "less_than_equal"):
        lo, hi = _RANGES.get(str(error["loc"][0]), (ctx.get("ge"), ctx.get("le")))
        return (f"must be in [{lo}, {hi:,}]" if lo is not None and hi is not None else
                error["msg"].lower()) + " (the bounds are far above any published decoder)"
    if kind == "bool_type":
        return "must be true or false"
    if kind == "literal_error":
        return (f"must be {SLIDING!r} or {FULL!r}: the planner does not size other layers "
                "(linear attention, state-space, ...)")
    if kind == "list_type":
        return "must be a list"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} entries"
    if kind == "missing":
        return "is required"
    if kind in ("dict_type", "model_type"):
        return "must be a JSON object"
    return str(error["msg"])


def _problems(exc: ValidationError, prefix: str) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    # A union (an int or a per-layer list) reports each arm: when one arm got past the type
    # check, its error is the one that explains the value; the other arm's type error is noise.
    explained = {e["loc"][0] for e in errors if e["loc"] and not e["type"].endswith("_type")}
    errors = [e for e in errors
              if not (e["type"].endswith("_type") and e["loc"] and e["loc"][0] in explained)]
    for error in errors:
        if error["type"] == "value_error":  # our consistency rules: already one line each
            msg = str(error["msg"]).removeprefix("Value error, ")
            out += [f"{prefix}{m}" for m in msg.split(" | ")]
            continue
        # A union (int or list) reports each arm: name the field once, by its first arm.
        loc = [str(p) for p in error["loc"] if p not in ("int", "list[constrained-int]")]
        if loc and loc[-1].startswith("constrained"):
            loc = loc[:-1]
        field = prefix + ".".join(loc)
        if field in seen:
            continue
        seen.add(field)
        if error["type"] == "missing":
            out.append(f"{field} {_rule(error)}")
        else:
            out.append(f"{field} = {_show(error['input'])}: {_rule(error)}")
    return out


def parse_text_config(config: Any) -> tuple[TextConfig, bool | None]:
    """(the validated decoder fields, the top-level tie_word_embeddings); GeometryError."""
    if not isinstance(config, dict):
        raise GeometryError([(f"the file holds {type(config).__name__}: must be a JSON object "
                             "(a Hugging Face config.json)")])
    try:
        outer = HfConfig.model_validate(config)
    except ValidationError as exc:
        raise GeometryError(_problems(exc, "")) from None
    nested = bool(outer.text_config)
    text = outer.text_config if nested else config
    prefix = "text_config." if nested else ""
    if unsized := unsized_problems(config) + (unsized_problems(text, prefix) if nested else []):
        raise GeometryError(unsized)
    try:
        return TextConfig.model_validate(text), outer.tie_word_embeddings
    except ValidationError as exc:
        raise GeometryError(_problems(exc, prefix)) from None


def named_model(config: Any) -> str | None:
    """The model id a config.json names itself by (`_name_or_path` / `name_or_path`), if any."""
    if not isinstance(config, dict):
        return None
    for key in ("_name_or_path", "name_or_path"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def read_config(path: str | Path) -> Any:
    """The JSON document of a geometry file, or GeometryError (too big, not JSON, too deep)."""
    with open(path, "rb") as f:  # OSError is the caller's: it names the file itself
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise GeometryError([(f"the file is over {MAX_FILE_BYTES:,} bytes: a Hugging Face "
                             "config.json is a few KB")])
    try:
        return json.loads(data)
    except RecursionError:
        raise GeometryError(["the JSON nests too deeply to be a config.json"]) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 5,000 digits
        raise GeometryError([f"not JSON: {' '.join(str(exc).split())[:120]}"]) from None


# The fields that say which decoder a config.json describes: two files that differ in any of
# them describe different models, whatever else they share.
ARCHITECTURE_FIELDS = ("model_type", "num_hidden_layers", "hidden_size", "num_key_value_heads",
                       "head_dim")


def architecture(config: Any) -> dict[str, Any]:
    """The decoder's ARCHITECTURE_FIELDS (text_config's for a multimodal config), with HF's
    defaults where absent (KV heads = heads, head_dim = hidden / heads); GeometryError."""
    text, _ = parse_text_config(config)
    raw = config.get("text_config") or config
    model_type = raw.get("model_type")
    return {"model_type": model_type if isinstance(model_type, str) else None,
            "num_hidden_layers": text.num_hidden_layers, "hidden_size": text.hidden_size,
            "num_key_value_heads": text.kv_heads, "head_dim": text.dim_per_head}


def extra_decoder_layers(config: Any) -> int:
    """Layers a checkpoint stores beyond num_hidden_layers: multi-token-prediction heads
    (`num_nextn_predict_layers`, DeepSeek V3 and GLM-4.5 number them after the last layer)."""
    raw = (config.get("text_config") or config) if isinstance(config, dict) else {}
    n = raw.get("num_nextn_predict_layers") if isinstance(raw, dict) else None
    return n if type(n) is int and 0 <= n <= MAX_LAYERS else 0
