"""The configured model's own geometry and weights, and where each figure comes from.

Nothing falls back to Gemma 4 E2B's figures: the default model's geometry file and its 8.97 GiB
are measured (SPEC 5) and apply only when vllm.model is that model. Another model takes its
geometry from capacity.model_geometry or from a file shipped in config/models/<org>/<name>/
config.json, and its weights from capacity.weights_gib or capacity.weights_index; without
either it is refused naming the setting.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuserve.facts import GiB
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.planner.geometry import (
    ARCHITECTURE_FIELDS,
    GeometryError,
    architecture,
    extra_decoder_layers,
    named_model,
    read_config,
)
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_profiles import DEFAULT_MODEL
from tpuserve.settings.sections import CapacitySettings

MODELS_DIR = DEFAULT_CONFIG.parent / "models"
# An index lists every tensor of a checkpoint: tens of KB for a 70B model; far more is not one.
MAX_INDEX_BYTES = 16 << 20
MAX_TOTAL_SIZE = 1 << 50
E2B_GEOMETRY = DEFAULT_CONFIG.parent / CapacitySettings.model_fields["model_geometry"].default
# A tensor's first layer container: `model.layers.12.`, `transformer.h.3.`, `...blocks.7.`.
_LAYER = re.compile(r"((?:[^.]+\.)*?)(?:layers|h|blocks)\.(\d{1,6})\.")
# Prefixes of towers and encoders, whose layers are not the decoder's num_hidden_layers
# (`model.vision_tower.encoder.layers.26.`, `visual.blocks.31.`, `audio_tower.layers.3.`).
_TOWER_WORDS = ("vision", "visual", "audio", "image", "encoder", "speech", "tower",
                "projector", "perceiver", "sound")


@dataclass(frozen=True)
class ModelInputs:
    """The geometry file and weight bytes the planner uses, with the source of each."""

    geometry_path: Path | None
    weights_bytes: int | None
    sources: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def shipped_geometry(model: str) -> Path | None:
    """config/models/<org>/<name>/config.json when this checkout ships one for the model."""
    path = (MODELS_DIR / model / "config.json").resolve()
    return path if path.is_file() and MODELS_DIR.resolve() in path.parents else None


def shipped_index(model: str) -> Path | None:
    path = (MODELS_DIR / model / "model.safetensors.index.json").resolve()
    return path if path.is_file() and MODELS_DIR.resolve() in path.parents else None


def index_total_size(path: Path) -> int:
    """metadata.total_size of a model.safetensors.index.json; ValueError says why not."""
    return int(read_index(path)["metadata"]["total_size"])


def read_index(path: Path) -> dict[str, Any]:
    """A model.safetensors.index.json with a byte count and a non-empty weight_map; ValueError
    says why not."""
    with open(path, "rb") as f:  # OSError is the caller's
        data = f.read(MAX_INDEX_BYTES + 1)
    if len(data) > MAX_INDEX_BYTES:
        raise ValueError(f"the file is over {MAX_INDEX_BYTES:,} bytes: not a safetensors index")
    try:
        doc: Any = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("not JSON: a model.safetensors.index.json is a JSON object") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    total = meta.get("total_size") if isinstance(meta, dict) else None
    # JSON true is not 1 and 8.0e9 is not a byte count: a strict integer or nothing.
    if type(total) is not int or not 0 < total <= MAX_TOTAL_SIZE:
        raise ValueError(f"metadata.total_size = {json.dumps(total)}: must be an integer "
                         f"byte count in [1, {MAX_TOTAL_SIZE:,}]")
    if not isinstance(doc.get("weight_map"), dict) or not doc["weight_map"]:
        raise ValueError("weight_map is missing or empty: not a safetensors index")
    return doc


def decoder_layers(weight_map: dict[str, Any]) -> tuple[int, str] | None:
    """(highest decoder layer number + 1, its name prefix) from the tensor names, towers and
    encoders left out; None when no name carries a decoder layer number."""
    best: tuple[int, str] | None = None
    for key in weight_map:
        m = _LAYER.match(key)
        if m is None or any(w in part for part in m.group(1).split(".") for w in _TOWER_WORDS):
            continue
        n = int(m.group(2)) + 1
        if best is None or n > best[0]:
            best = (n, key[: m.start(2)])
    return best


def _geometry(d: Deployment, problems: list[str], sources: dict[str, str]
              ) -> tuple[Path | None, str]:
    """The geometry file, the name a refusal gives it (a setting or a shipped file)."""
    c, model = d.capacity, d.vllm.model
    user = "model_geometry" in c.model_fields_set
    name = f"capacity.model_geometry = {c.model_geometry!r}"
    if user:
        path = c.geometry_path
        sources["geometry"] = f"derived from {name}"
    elif model == DEFAULT_MODEL:
        sources["geometry"] = "measured SPEC 5 (config/models/gemma-4-E2B-it.json)"
        return c.geometry_path, name
    elif (shipped := shipped_geometry(model)) is not None:
        path, name = shipped, f"config/models/{model}/config.json"
        sources["geometry"] = f"derived from {name} (shipped; see config/models/README.md)"
    else:
        problems.append(
            f"vllm.model = {model!r}: no geometry for this model (capacity.model_geometry is "
            f"unset and config/models/ ships none for it); set capacity.model_geometry to its "
            f"config.json: the planner never sizes one model from another's ({DEFAULT_MODEL}'s "
            "figures are measured for it alone, SPEC 5)")
        return None, name
    try:
        doc = read_config(path)
    except (OSError, GeometryError):
        return path, name  # capacity_problems reports the file itself
    named = named_model(doc)
    if named is not None and named != model:
        problems.append(
            f"{name}: the file names {named!r} but vllm.model = {model!r}; a geometry file must "
            "describe the model served (its _name_or_path), or the plan sizes another model")
        return path, name
    if not user:
        return path, name
    reference = E2B_GEOMETRY if model == DEFAULT_MODEL else shipped_geometry(model)
    if reference is not None:
        if reference.resolve() != path.resolve():
            problems.extend(_differs_from_shipped(name, doc, reference, model))
    elif named is None:
        # Nothing here can tell which model the file is: the plan says so rather than prove it.
        sources["geometry"] += f" (the file names no model: taken as {model}'s on the user's word)"
    return path, name


def _differs_from_shipped(name: str, doc: Any, reference: Path, model: str) -> list[str]:
    """One line when the user's geometry differs from the one shipped for the model in a field
    that says which decoder it is; [] when it parses badly (capacity_problems says why)."""
    try:
        mine, shipped = architecture(doc), architecture(read_config(reference))
    except (OSError, GeometryError):
        return []
    diffs = [f"{f} = {json.dumps(mine[f])} (the shipped file's: {json.dumps(shipped[f])})"
             for f in ARCHITECTURE_FIELDS if mine[f] != shipped[f]]
    if not diffs:
        return []
    shown = ("config/models/gemma-4-E2B-it.json" if model == DEFAULT_MODEL else
             f"config/models/{model}/config.json")
    return [(f"{name}: {', '.join(diffs)}: vllm.model = {model!r} ships {shown} and a "
             "geometry that differs from it in these fields describes another model; point "
             "capacity.model_geometry at this model's config.json or unset it")]


def _index_layers(index_name: str, weight_map: dict[str, Any], geometry: Path, name: str,
                  problems: list[str], sources: dict[str, str]) -> None:
    """Refuse an index whose decoder layers are not the geometry's: the two files would
    describe two models, and the plan would price one model's weights on another's KV."""
    try:
        doc = read_config(geometry)
        layers = architecture(doc)["num_hidden_layers"]
    except (OSError, GeometryError):
        return  # capacity_problems reports the geometry file itself
    found = decoder_layers(weight_map)
    if found is None:
        sources["weights_bytes"] += ("; its tensor names carry no decoder layer numbers, so it "
                                     "is not cross-checked against the geometry's "
                                     "num_hidden_layers")
        return
    count, prefix = found
    allowed = {layers, layers + extra_decoder_layers(doc)}
    if count not in allowed:
        problems.append(
            f"{index_name}: its tensor names number {count} decoder layers ({prefix}0 to "
            f"{prefix}{count - 1}) but {name} has num_hidden_layers = {layers}: the index and "
            "the geometry describe different models; point both at the same model's files")


def _weights(d: Deployment, problems: list[str], sources: dict[str, str]
             ) -> tuple[int | None, tuple[str, dict[str, Any]] | None]:
    """The weight bytes, and (the index's name, its weight_map) when an index gave them."""
    c, model = d.capacity, d.vllm.model
    index, index_name = c.weights_index_path, f"capacity.weights_index = {c.weights_index!r}"
    if index is None and "weights_gib" not in c.model_fields_set and model != DEFAULT_MODEL:
        index = shipped_index(model)
        index_name = f"config/models/{model}/model.safetensors.index.json"
    if index is not None:
        try:
            doc = read_index(index)
        except OSError as exc:
            problems.append(f"{index_name}: {exc.strerror or exc}")
            return None, None
        except ValueError as exc:
            problems.append(f"{index_name}: {exc}")
            return None, None
        sources["weights_bytes"] = (
            f"derived from {index_name} metadata.total_size (an upper bound: vision/audio "
            "towers and the checkpoint's dtype included)")
        return int(doc["metadata"]["total_size"]), (index_name, doc["weight_map"])
    if "weights_gib" in c.model_fields_set:
        sources["weights_bytes"] = f"capacity.weights_gib setting ({c.weights_gib} GiB)"
        return round(c.weights_gib * GiB), None
    if model == DEFAULT_MODEL:
        sources["weights_bytes"] = "measured SPEC 5 (8.97 GiB resident, towers included)"
        return round(c.weights_gib * GiB), None
    problems.append(
        f"vllm.model = {model!r}: no weights figure (capacity.weights_gib and "
        "capacity.weights_index are unset); set one: the measured 8.97 GiB is "
        f"{DEFAULT_MODEL}'s (SPEC 5), not this model's")
    return None, None


def model_inputs(d: Deployment) -> ModelInputs:
    """The deployment's geometry path and weight bytes, their sources, and refusals."""
    problems: list[str] = []
    sources: dict[str, str] = {}
    path, name = _geometry(d, problems, sources)
    weights, index = _weights(d, problems, sources)
    if path is not None and index is not None:
        _index_layers(*index, path, name, problems, sources)
    return ModelInputs(path, weights, sources, tuple(problems))


def plan_sources(d: Deployment) -> dict[str, str]:
    """`plan --json`'s `sources`: which figure is measured, which derived, and from what."""
    from tpuserve.settings.model_profiles import profile_source  # settings-only, no cycle
    from tpuserve.settings.pair_sources import pair_sources

    inputs = model_inputs(d)
    e2b = d.vllm.model == DEFAULT_MODEL
    measured_geometry = inputs.sources.get("geometry", "").startswith("measured")
    kv = ("measured SPEC 5 (18,432 B/token at TP 1, recomputed from the geometry)"
          if measured_geometry and d.vllm.tensor_parallel_size == 1 else
          "derived from the measured geometry (SPEC 5 arithmetic)" if measured_geometry else
          "derived: computed from the model's geometry (see geometry)")
    v5e = d.tpu.accelerator_type.startswith("v5litepod")
    return {
        "weights_bytes": inputs.sources.get("weights_bytes", "none"),
        "geometry": inputs.sources.get("geometry", "none"),
        "kv_bytes_per_token": kv,
        "hbm": ("measured SPEC 5: 15.75 GiB visible per v5e chip" if v5e else
                "not measured on this chip: the planner's chip figures (see the accelerator "
                "table)"),
        **pair_sources(d),  # SPEC 5's TPOT and SPEC 4's boots: the measured pair's only
        # SPEC 6 measured the pair alone; `plan` derives every other (planner/throughput.py).
        "throughput": ("measured SPEC 6 (Gemma 4 E2B, v5litepod-1)"
                       if e2b and d.tpu.accelerator_type == "v5litepod-1" else
                       "derived: this model's tok/s on this slice, every cell scaled from "
                       "measured SPEC 6 (Gemma 4 E2B, v5litepod-1) by bytes per decode step and "
                       "bandwidth (`tpuserve plan` shows the table)"),
        "profile": profile_source(d.vllm.model, d.tpu.accelerator_type, d.vllm.image),
        "capacity_rules": ("measured SPEC 4-5 (Gemma 4 E2B on v5litepod-1)"
                           if e2b and d.tpu.accelerator_type == "v5litepod-1" else
                           "derived: SPEC 4-5's rules measured for Gemma 4 E2B on v5litepod-1, "
                           "applied to this model and chip from its geometry"),
    }
