"""The configs the tuner may try: sets per flag from the planner or [tune], each candidate
validated through the real settings model and planner; a refused one is dropped with its reason.

Context lengths (max_model_len): a ladder from the configured one, doubling, up to the largest
one request's KV allows: the planner's KV capacity (tokens in the Pallas blocks of the pool at the
set's highest memory fraction, settings/capacity.plan_for) and the model's max_position_embeddings
(its geometry); at most LADDER values. A model whose geometry does not state its trained context
gets the configured value and its double only (vLLM refuses a longer context than the model's,
and nothing here says how long that is); the first step past the ladder is kept in the set so
the settings refuse it and the report lists it with its reason.

Speculative decoding (`[vllm] speculative_config`, settings/speculative.py): n-gram (no draft
checkpoint) is in the planner's set; it is a candidate only where the settings take it (the
stack sets vllm.allow_untested_speculative_config), since support on the pinned image is not
proved (speculative.SUPPORT); elsewhere it is refused with that reason and listed. [tune]
speculative_config lists other tables (or "off") to restrict or extend the set.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve.facts import GPU_MEM_CEILING, GPU_MEM_FATAL, MM_ITEM_TOKENS
from tpuserve.settings import ConfigError, Deployment
from tpuserve.settings.accelerator_rules import memory_ceiling
from tpuserve.settings.loader import deep_merge, from_raw
from tpuserve.settings.speculative import unsupported

# The flags searched, in the order every table shows them: (name, where it lives in [vllm]).
DIMENSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("max_num_batched_tokens", ("max_num_batched_tokens",)),
    ("max_num_seqs", ("max_num_seqs",)),
    ("max_model_len", ("max_model_len",)),
    ("VLLM_TPU_BUCKET_PADDING_GAP", ("env", "VLLM_TPU_BUCKET_PADDING_GAP")),
    ("NUM_PRECOMPILE_WORKERS", ("env", "NUM_PRECOMPILE_WORKERS")),
    ("gpu_memory_utilization", ("gpu_memory_utilization",)),
    ("speculative_config", ("speculative_config",)),
)
NAMES = tuple(n for n, _ in DIMENSIONS)
# The order the combinations are listed in: the search plan's stages (tune/plan.py) last to
# first, so the first stage's flags vary fastest and its candidates lead the list.
PRODUCT_ORDER = ("NUM_PRECOMPILE_WORKERS", "max_model_len", "gpu_memory_utilization",
                 "speculative_config", "max_num_batched_tokens", "max_num_seqs",
                 "VLLM_TPU_BUCKET_PADDING_GAP")
UNSET = "unset"  # max_num_seqs left to vLLM's default
OFF = "off"  # no speculative decoding; any other speculative value is its table as JSON
# n-gram drafting as vLLM documents it; the settings check every key (settings/speculative.py).
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
                   sort_keys=True)
_SHORT = {"max_num_batched_tokens": "b", "max_num_seqs": "s", "max_model_len": "l",
          "VLLM_TPU_BUCKET_PADDING_GAP": "g", "NUM_PRECOMPILE_WORKERS": "w",
          "gpu_memory_utilization": "m", "speculative_config": "d"}


@dataclass(frozen=True)
class Candidate:
    """One config: a value per searched flag."""

    values: tuple[tuple[str, Any], ...]  # in DIMENSIONS' order

    @property
    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    @property
    def id(self) -> str:
        """A short stable name: b4096 s- l32768 g0 w1 m0.92 (+ dngram4 with n-gram drafting)."""
        return " ".join(f"{_SHORT[k]}{_short_value(k, v)}" for k, v in self.values
                        if not (k == "speculative_config" and v == OFF))

    def overlay(self) -> dict[str, Any]:
        """The [vllm] table that sets this config over the stack's own."""
        out: dict[str, Any] = {}
        for name, path in DIMENSIONS:
            value = self.as_dict[name]
            if value in (UNSET, OFF):
                continue
            if name == "speculative_config":
                value = json.loads(value)
            table = out
            for key in path[:-1]:
                table = table.setdefault(key, {})
            table[path[-1]] = value
        if self.as_dict["gpu_memory_utilization"] > GPU_MEM_CEILING:
            # Above the measured ceiling: allowed for this candidate only (SPEC 4).
            out["allow_untested_gpu_memory_utilization"] = True
        return out


def _short_value(name: str, value: Any) -> str:
    if value == UNSET:
        return "-"
    if name == "speculative_config":
        doc = json.loads(value)
        return f"{doc.get('method')}{doc.get('num_speculative_tokens')}"
    return str(value)


def speculative_value(table: Any) -> str:
    """A speculative config as a candidate holds it: OFF, or its table as sorted JSON."""
    if table in (None, "", {}, OFF):
        return OFF
    return json.dumps(table, sort_keys=True)


@dataclass(frozen=True)
class Refused:
    what: str  # a candidate's id, or `setting = value` for a value refused on its own
    reason: str


@dataclass(frozen=True)
class Space:
    candidates: tuple[Candidate, ...]
    refused: tuple[Refused, ...]
    baseline: Candidate  # the stack's own config, as a candidate


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


LADDER = 4  # context lengths at most in the planner's set (each a value of a searched stage)


def context_limit(d: Deployment, memory: float) -> tuple[int | None, str]:
    """The longest context one request's KV allows at MEMORY, and the model's trained context
    (None when its geometry does not state it), with the figures' words."""
    from tpuserve.planner.arithmetic import load_geometry
    from tpuserve.settings.capacity import plan_for
    from tpuserve.settings.model_inputs import model_inputs

    try:
        kv = plan_for(d, gpu_memory_utilization=memory).kv_block_tokens
        path = model_inputs(d).geometry_path
        trained = load_geometry(path).max_position_embeddings if path is not None else None
    except (OSError, ValueError):
        return None, "the planner has no KV figure for this model"
    if trained is None:
        return None, (f"KV holds {kv:,} tokens at {memory}, but the model's geometry does not "
                      "state max_position_embeddings")
    return min(kv, trained), (f"KV holds {kv:,} tokens at {memory}; the model's "
                              f"max_position_embeddings is {trained:,}")


def context_ladder(d: Deployment, memory: float) -> list[int]:
    """The configured length doubling up to the limit (the limit itself as the top step),
    at most LADDER values, then the first step past it (which the settings refuse)."""
    low = d.vllm.max_model_len
    limit, _words = context_limit(d, memory)
    if limit is None:
        return [low, low * 2]
    out = [low]
    while len(out) < LADDER and out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    if len(out) < LADDER and out[-1] < limit:
        out.append(limit // 1024 * 1024 if limit >= 2048 else limit)
    out.append(out[-1] * 2)
    return list(dict.fromkeys(out))


def default_sets(d: Deployment) -> dict[str, list[Any]]:
    """The planner's sets for the stack, before validation: each holds the configured value."""
    v = d.vllm
    mm = v.disable_chunked_mm_input and any(v.limit_mm_per_prompt.values())
    # At or above the multimodal floor's power-of-two bucket (SPEC 4: 2496 compiled as 4096).
    low = _pow2_at_least(MM_ITEM_TOKENS if mm else v.max_num_batched_tokens)
    ceiling = memory_ceiling(d.tpu.accelerator).value
    # 0.01 steps from the slice's ceiling up to, not including, the lowest measured failure.
    steps = round((GPU_MEM_FATAL - ceiling) * 100)
    memory = [round(ceiling + i / 100, 2) for i in range(max(steps, 1))]
    sets: dict[str, list[Any]] = {
        "max_num_batched_tokens": [low, low * 2],
        "max_num_seqs": [UNSET, 128],
        "max_model_len": context_ladder(d, max([*memory, v.gpu_memory_utilization])),
        "VLLM_TPU_BUCKET_PADDING_GAP": [0, 128],
        "NUM_PRECOMPILE_WORKERS": [1, 2, 4],
        "gpu_memory_utilization": memory,
        # n-gram: a candidate where the settings take it (vllm.allow_untested_speculative_
        # config), refused and listed with the reason elsewhere (settings/speculative.py).
        "speculative_config": [OFF, NGRAM],
    }
    current = configured(d)
    for name, values in sets.items():
        if current[name] not in values:
            values.insert(0, current[name])
    return sets


def configured(d: Deployment) -> dict[str, Any]:
    """The stack's own value of every searched flag."""
    v = d.vllm
    return {
        "max_num_batched_tokens": v.max_num_batched_tokens,
        "max_num_seqs": UNSET if v.max_num_seqs is None else v.max_num_seqs,
        "max_model_len": v.max_model_len,
        "VLLM_TPU_BUCKET_PADDING_GAP": v.env.VLLM_TPU_BUCKET_PADDING_GAP,
        "NUM_PRECOMPILE_WORKERS": v.env.NUM_PRECOMPILE_WORKERS,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "speculative_config": speculative_value(v.speculative_config),
    }


def sets_for(d: Deployment) -> dict[str, list[Any]]:
    """The planner's sets, each replaced by the [tune] table's where it gives one."""
    sets = default_sets(d)
    for name in NAMES:
        given = getattr(d.tune, name)
        if given is not None:
            if name == "speculative_config":
                given = [speculative_value(t) for t in given]
            sets[name] = list(dict.fromkeys(given))
    return sets


def refusal(raw: Mapping[str, Any], stack: str, overlay: Mapping[str, Any]) -> str | None:
    """Why the settings and the planner refuse the stack with `overlay` over its [vllm], or
    None when they take it."""
    if "max_num_seqs" not in overlay and _sets_max_num_seqs(raw, stack):
        return ("vllm.max_num_seqs: the config sets it and a TOML overlay cannot unset it "
                "(TOML has no null)")
    if "speculative_config" not in overlay and _sets(raw, stack, "speculative_config"):
        return ("vllm.speculative_config: the config sets it; list only speculative configs "
                "in [tune] speculative_config")
    table = deep_merge(raw.get("stacks", {}).get(stack, {}), {"vllm": dict(overlay)})
    try:
        from_raw({**raw, "stacks": {stack: table}})
    except ConfigError as exc:
        return "; ".join(exc.problems)
    return None


def _sets_max_num_seqs(raw: Mapping[str, Any], stack: str) -> bool:
    return _sets(raw, stack, "max_num_seqs")


def _sets(raw: Mapping[str, Any], stack: str, name: str) -> bool:
    own = raw.get("stacks", {}).get(stack, {}).get("vllm", {})
    return any(t.get(name) not in (None, "", {}) for t in (raw.get("vllm", {}), own)
               if name in t)


def space(d: Deployment, raw: Mapping[str, Any], *, limit: int = 4096) -> Space:
    """Every candidate the settings take, and every value or combination they refuse."""
    sets = sets_for(d)
    current = configured(d)
    refused: list[Refused] = []
    if d.tune.max_model_len is None:
        longest, words = context_limit(d, max(sets["gpu_memory_utilization"]))
        if longest is None:  # the ladder stops at the double: nothing proves a longer one
            refused.append(Refused(f"max_model_len above {max(sets['max_model_len'])}",
                                   f"{words}, so no longer context is proved to load"))
    kept: dict[str, list[Any]] = {}
    # A context length is probed at the highest memory step the settings take: it may fit
    # only there, and each combination is validated below anyway.
    order = sorted(sets, key=lambda n: n == "max_model_len")
    for name in order:
        kept[name] = []
        for value in sets[name]:
            base = dict(current)
            if name == "max_model_len" and kept["gpu_memory_utilization"]:
                base["gpu_memory_utilization"] = max(kept["gpu_memory_utilization"])
            probe = Candidate(tuple((n, value if n == name else base[n]) for n in NAMES))
            why = refusal(raw, d.name, probe.overlay()) if value != current[name] else None
            if why is not None and name == "speculative_config" and value != OFF:
                why += "; " + unsupported(json.loads(value).get("method"), d.vllm.model)
            elif why is not None and name == "max_model_len" and value > current[name]:
                why += f" ({context_limit(d, base['gpu_memory_utilization'])[1]})"
            if why is None:
                kept[name].append(value)
            else:
                refused.append(Refused(f"{name} = {value}", why))
    combos = [dict(zip(PRODUCT_ORDER, combo, strict=True))
              for combo in itertools.product(*(kept[n] for n in PRODUCT_ORDER))]
    if len(combos) > limit:
        raise ValueError(f"{len(combos)} candidates: more than {limit}; restrict the sets in "
                         "[tune]")
    out: list[Candidate] = []
    for combo in combos:
        c = Candidate(tuple((n, combo[n]) for n in NAMES))
        why = refusal(raw, d.name, c.overlay())
        if why is None:
            out.append(c)
        else:
            refused.append(Refused(c.id, why))
    return Space(tuple(out), tuple(refused),
                 Candidate(tuple((n, current[n]) for n in NAMES)))


def by_id(candidates: Sequence[Candidate]) -> dict[str, Candidate]:
    return {c.id: c for c in candidates}
