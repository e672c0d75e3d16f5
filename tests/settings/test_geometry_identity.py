"""A geometry and an index must describe the served model: refused naming the setting when
they describe another, and labelled the user's word where nothing can tell."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.settings import ConfigError, from_raw, load_raw, model_inputs
from tpuserve.settings.derived_labels import derived_figures
from tpuserve.settings.model_inputs import plan_sources

MODELS = DEFAULT_CONFIG.parent / "models"
GRANITE = "ibm-granite/granite-3b-code-instruct-128k"
G2B = "google/gemma-2b-it"
# A small decoder no file in config/models/ describes (4 layers, 8 query / 2 KV heads).
TINY = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 64, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 1000}


def write(tmp_path: Path, toml: str, files: dict[str, Any]) -> Path:
    for name, doc in files.items():
        if isinstance(doc, Path):
            shutil.copy(doc, tmp_path / name)
        else:
            (tmp_path / name).write_text(json.dumps(doc))
    (tmp_path / "user.toml").write_text(toml)
    return tmp_path / "user.toml"


def load(tmp_path: Path, toml: str, files: dict[str, Any]) -> Any:
    user = write(tmp_path, toml, files)
    return from_raw(load_raw(environ={"TPUSERVE_CONFIG": str(user)}))


def problems(tmp_path: Path, toml: str, files: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, toml, files)
    return exc.value.problems


def toml(model: str, geometry: str | None = "g.json", index: str | None = "i.json",
         extra: str = "") -> str:
    lines = [f'[vllm]\nmodel = "{model}"\n{extra}[capacity]\n']
    lines += [f'model_geometry = "{geometry}"\n'] if geometry else []
    lines += [f'weights_index = "{index}"\n'] if index else ['weights_gib = 1.0\n']
    return "".join(lines)


def index(names: list[str], total: int = 1 << 30) -> dict[str, Any]:
    return {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(names, "a.bin")}


def layers(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}.self_attn.q_proj.weight" for i in range(n)]


# ------------------------------------------------------- (a) the index against the geometry

def test_an_index_of_another_model_is_refused_naming_both_settings_and_counts(
    tmp_path: Path
) -> None:
    """Granite's geometry with Gemma 2B's index: 18 layers of tensors against 32 layers."""
    lines = problems(tmp_path, toml(GRANITE), {
        "g.json": MODELS / GRANITE / "config.json",
        "i.json": MODELS / G2B / "model.safetensors.index.json"})
    [line] = [p for p in lines if "decoder layers" in p]
    assert "\n" not in line
    assert f"capacity.weights_index = '{tmp_path / 'i.json'}'" in line
    assert "number 18 decoder layers (model.layers.0 to model.layers.17)" in line
    assert f"capacity.model_geometry = '{tmp_path / 'g.json'}' has num_hidden_layers = 32" in line


def test_the_shipped_index_is_checked_against_a_users_geometry(tmp_path: Path) -> None:
    """vllm.model ships an index: a user geometry of another layer count is refused by it."""
    geometry = {**json.loads((MODELS / G2B / "config.json").read_text()),
                "num_hidden_layers": 20}
    lines = problems(tmp_path, f'[vllm]\nmodel = "{G2B}"\n[capacity]\n'
                     'model_geometry = "g.json"\n', {"g.json": geometry})
    assert any(f"config/models/{G2B}/model.safetensors.index.json: its tensor names number 18"
               in p and "num_hidden_layers = 20" in p for p in lines), lines


@pytest.mark.parametrize("model", [GRANITE, G2B])
def test_the_shipped_pairs_pass(tmp_path: Path, model: str) -> None:
    for files in ({"g.json": MODELS / model / "config.json",
                   "i.json": MODELS / model / "model.safetensors.index.json"}, {}):
        ctx = "max_model_len = 8192\n"
        text = toml(model, extra=ctx) if files else f'[vllm]\nmodel = "{model}"\n{ctx}'
        d = load(tmp_path, text, files).deployments["spot"]
        assert "not cross-checked" not in plan_sources(d)["weights_bytes"]
        assert "user's word" not in plan_sources(d)["geometry"]


def test_a_multimodal_index_counts_the_decoder_not_the_towers(tmp_path: Path) -> None:
    geometry = {"model_type": "acme_vl", "text_config": {**TINY, "model_type": "acme_text"}}
    names = (layers("model.language_model.layers.", 4)
             + layers("model.vision_tower.encoder.layers.", 27)
             + layers("visual.blocks.", 32) + layers("model.audio_tower.layers.", 12))
    d = load(tmp_path, toml("acme/tiny-vl"),
             {"g.json": geometry, "i.json": index(names)}).deployments["spot"]
    found = model_inputs.decoder_layers(index(names)["weight_map"])
    assert found == (4, "model.language_model.layers.")
    assert "not cross-checked" not in plan_sources(d)["weights_bytes"]
    lines = problems(tmp_path, toml("acme/tiny-vl"), {
        "g.json": geometry, "i.json": index(layers("model.language_model.layers.", 6))})
    assert any("number 6 decoder layers" in p and "num_hidden_layers = 4" in p for p in lines)


def test_multi_token_prediction_layers_after_the_last_are_allowed(tmp_path: Path) -> None:
    """DeepSeek V3 / GLM-4.5 store their MTP head as layer num_hidden_layers."""
    names = layers("model.layers.", 5)
    lines = problems(tmp_path, toml("acme/tiny"), {"g.json": TINY, "i.json": index(names)})
    assert any("number 5 decoder layers" in p for p in lines)
    load(tmp_path, toml("acme/tiny"), {"g.json": {**TINY, "num_nextn_predict_layers": 1},
                                       "i.json": index(names)})


def test_an_index_without_layer_numbers_is_not_cross_checked_and_says_so(
    tmp_path: Path
) -> None:
    d = load(tmp_path, toml("acme/tiny"), {
        "g.json": TINY, "i.json": index(["model.embed_tokens.weight", "lm_head.weight"])
    }).deployments["spot"]
    source = plan_sources(d)["weights_bytes"]
    assert source.startswith(f"derived from capacity.weights_index = '{tmp_path / 'i.json'}'")
    assert "carry no decoder layer numbers, so it is not cross-checked" in source


# --------------------------------------------- (c) a model config/models/ ships a file for

def test_another_models_geometry_for_a_shipped_model_is_refused(tmp_path: Path) -> None:
    """The outside tester's case: Granite served with Gemma 2B's files, neither named."""
    lines = problems(tmp_path, toml(GRANITE, extra="max_model_len = 8192\n"), {
        "g.json": MODELS / G2B / "config.json",
        "i.json": MODELS / G2B / "model.safetensors.index.json"})
    [line] = [p for p in lines if "the shipped file's" in p]
    assert f"] capacity.model_geometry = '{tmp_path / 'g.json'}': " in line
    for field in ('model_type = "gemma" (the shipped file\'s: "llama")',
                  "num_hidden_layers = 18 (the shipped file's: 32)",
                  "hidden_size = 2048 (the shipped file's: 2560)",
                  "num_key_value_heads = 1 (the shipped file's: 32)",
                  "head_dim = 256 (the shipped file's: 80)"):
        assert field in line
    assert f"ships config/models/{GRANITE}/config.json" in line


def test_a_toy_geometry_for_the_default_model_is_refused(tmp_path: Path) -> None:
    lines = problems(tmp_path, toml("google/gemma-4-E2B-it", index=None), {"g.json": TINY})
    assert any("num_hidden_layers = 4 (the shipped file's: 35)" in p
               and "ships config/models/gemma-4-E2B-it.json" in p for p in lines), lines


def test_a_users_copy_of_a_shipped_geometry_passes(tmp_path: Path) -> None:
    """Only the identity fields count: a copy with other extra fields is the same model."""
    e2b = json.loads((MODELS / "gemma-4-E2B-it.json").read_text())
    load(tmp_path, toml("google/gemma-4-E2B-it", index=None),
         {"g.json": {**e2b, "transformers_version": "5.0.0"}})
    top = e2b["text_config"]  # a text-only copy: the decoder at top level
    load(tmp_path, toml("google/gemma-4-E2B-it", index=None), {"g.json": top})


# ------------------------------------------------ (d) an unnamed file for an unknown model

def test_an_unnamed_geometry_for_an_unknown_model_is_the_users_word(tmp_path: Path) -> None:
    d = load(tmp_path, toml("acme/tiny", index=None), {"g.json": TINY}).deployments["spot"]
    want = (f"derived from capacity.model_geometry = '{tmp_path / 'g.json'}' (the file names "
            "no model: taken as acme/tiny's on the user's word)")
    assert plan_sources(d)["geometry"] == want
    assert derived_figures(d)["geometry"] == want  # what review and the synth summary print
    named = load(tmp_path, toml("acme/tiny", index=None),
                 {"g.json": {**TINY, "_name_or_path": "acme/tiny"}}).deployments["spot"]
    assert plan_sources(named)["geometry"] == (
        f"derived from capacity.model_geometry = '{tmp_path / 'g.json'}'")
