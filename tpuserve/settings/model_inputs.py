"""The configured model's own geometry and weights, and where each figure comes from.

Nothing falls back to Gemma 4 E2B's figures: the default model's geometry file and its 8.97 GiB
are measured (SPEC 5) and apply only when vllm.model is that model. Another model takes its
geometry from capacity.model_geometry or from a file shipped in config/models/<org>/<name>/
config.json, and its weights from capacity.weights_gib or capacity.weights_index; without
either it is refused naming the setting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuserve.facts import GiB
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.planner.geometry import GeometryError, named_model, read_config
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_profiles import DEFAULT_MODEL

MODELS_DIR = DEFAULT_CONFIG.parent / "models"
# An index lists every tensor of a checkpoint: tens of KB for a 70B model; far more is not one.
MAX_INDEX_BYTES = 16 << 20
MAX_TOTAL_SIZE = 1 << 50


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
    return total


def _geometry(d: Deployment, problems: list[str], sources: dict[str, str]) -> Path | None:
    c, model = d.capacity, d.vllm.model
    if "model_geometry" in c.model_fields_set:
        path, name = c.geometry_path, f"capacity.model_geometry = {c.model_geometry!r}"
        sources["geometry"] = f"derived from {name}"
    elif model == DEFAULT_MODEL:
        sources["geometry"] = "measured SPEC 5 (config/models/gemma-4-E2B-it.json)"
        return c.geometry_path
    elif (shipped := shipped_geometry(model)) is not None:
        path, name = shipped, f"config/models/{model}/config.json"
        sources["geometry"] = f"derived from {name} (shipped; see config/models/README.md)"
    else:
        problems.append(
            f"vllm.model = {model!r}: no geometry for this model (capacity.model_geometry is "
            f"unset and config/models/ ships none for it); set capacity.model_geometry to its "
            f"config.json: the planner never sizes one model from another's ({DEFAULT_MODEL}'s "
            "figures are measured for it alone, SPEC 5)")
        return None
    try:
        named = named_model(read_config(path))
    except (OSError, GeometryError):
        return path  # capacity_problems reports the file itself
    if named is not None and named != model:
        problems.append(
            f"{name}: the file names {named!r} but vllm.model = {model!r}; a geometry file must "
            "describe the model served (its _name_or_path), or the plan sizes another model")
    return path


def _weights(d: Deployment, problems: list[str], sources: dict[str, str]) -> int | None:
    c, model = d.capacity, d.vllm.model
    index, index_name = c.weights_index_path, f"capacity.weights_index = {c.weights_index!r}"
    if index is None and "weights_gib" not in c.model_fields_set and model != DEFAULT_MODEL:
        index = shipped_index(model)
        index_name = f"config/models/{model}/model.safetensors.index.json"
    if index is not None:
        try:
            total = index_total_size(index)
        except OSError as exc:
            problems.append(f"{index_name}: {exc.strerror or exc}")
            return None
        except ValueError as exc:
            problems.append(f"{index_name}: {exc}")
            return None
        sources["weights_bytes"] = (
            f"derived from {index_name} metadata.total_size (an upper bound: vision/audio "
            "towers and the checkpoint's dtype included)")
        return total
    if "weights_gib" in c.model_fields_set:
        sources["weights_bytes"] = f"capacity.weights_gib setting ({c.weights_gib} GiB)"
        return round(c.weights_gib * GiB)
    if model == DEFAULT_MODEL:
        sources["weights_bytes"] = "measured SPEC 5 (8.97 GiB resident, towers included)"
        return round(c.weights_gib * GiB)
    problems.append(
        f"vllm.model = {model!r}: no weights figure (capacity.weights_gib and "
        "capacity.weights_index are unset); set one: the measured 8.97 GiB is "
        f"{DEFAULT_MODEL}'s (SPEC 5), not this model's")
    return None


def model_inputs(d: Deployment) -> ModelInputs:
    """The deployment's geometry path and weight bytes, their sources, and refusals."""
    problems: list[str] = []
    sources: dict[str, str] = {}
    path = _geometry(d, problems, sources)
    weights = _weights(d, problems, sources)
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
