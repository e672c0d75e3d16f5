"""A text-only model (its profile, or none, has no multimodal item) has no chunked-multimodal
floor: no --disable-chunked-mm-input in its argv, no multimodal floor line among its derived
figures, and max_num_batched_tokens below 2496 accepted. A model with multimodal items keeps
the flag, the floor and its label; the default argv is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuserve.render.vllm_args import serve_argv
from tpuserve.settings import ConfigError
from tpuserve.settings.derived_labels import derived_figures
from tpuserve.settings.loader import load

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 28,
         "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 3072, "intermediate_size": 8192, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": True}
INDEX = {"metadata": {"total_size": 6_425_499_648}, "weight_map": {"lm": "model-1.safetensors"}}
FLOOR = "vllm.max_num_batched_tokens"


def _load(tmp_path: Path, vllm: str = "") -> dict:
    (tmp_path / "l.json").write_text(json.dumps(LLAMA))
    (tmp_path / "i.json").write_text(json.dumps(INDEX))
    (tmp_path / "u.toml").write_text(
        '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n' + vllm
        + '[capacity]\nmodel_geometry = "l.json"\nweights_index = "i.json"\n')
    return load(environ={"TPUSERVE_CONFIG": str(tmp_path / "u.toml")}).deployments


def test_a_text_only_model_has_no_multimodal_flag_nor_floor(tmp_path: Path) -> None:
    d = _load(tmp_path, "max_num_batched_tokens = 1024\n")["spot"]
    argv = serve_argv(d.vllm)
    assert "--disable-chunked-mm-input" not in argv and "--limit-mm-per-prompt" not in argv
    assert d.vllm.max_num_batched_tokens == 1024
    assert FLOOR not in derived_figures(d)


def test_a_model_given_multimodal_items_keeps_the_flag_the_floor_and_its_label(
        tmp_path: Path) -> None:
    d = _load(tmp_path, "limit_mm_per_prompt = { image = 2 }\n")["spot"]
    assert "--disable-chunked-mm-input" in serve_argv(d.vllm)
    assert "E2B's 2496 tokens per multimodal item" in derived_figures(d)[FLOOR]
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, "limit_mm_per_prompt = { image = 2 }\nmax_num_batched_tokens = 1024\n")
    assert "must be >= 2496" in str(exc.value)


def test_the_default_model_keeps_its_multimodal_argv() -> None:
    argv = serve_argv(load(environ={}).deployments["spot"].vllm)
    assert "--disable-chunked-mm-input" in argv and "--limit-mm-per-prompt" in argv
