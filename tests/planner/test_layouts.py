"""The attention layouts the planner sizes, and the ones it refuses by name (synthetic configs)."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.planner.arithmetic import ModelGeometry, kv_bytes_per_token
from tpuserve.planner.geometry import FULL, SLIDING, GeometryError, named_model


def cfg(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"num_hidden_layers": 4, "num_attention_heads": 8,
                            "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 512,
                            "intermediate_size": 1024, "vocab_size": 1000}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def kv(config: dict[str, Any]) -> int:
    return kv_bytes_per_token(ModelGeometry.from_hf_config(config))


def test_grouped_query_is_kv_heads_times_head_dim_per_layer() -> None:
    assert kv(cfg()) == 4 * 2 * 2 * 64 * 2  # layers x K,V x heads x dim x bf16


def test_multi_head_when_num_key_value_heads_is_absent() -> None:
    # HF's own default: one KV head per query head.
    assert kv(cfg(num_key_value_heads=None)) == 4 * 2 * 8 * 64 * 2


def test_multi_query_one_kv_head() -> None:
    assert kv(cfg(num_key_value_heads=1)) == 4 * 2 * 1 * 64 * 2


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    assert ModelGeometry.from_hf_config(cfg(head_dim=None)).head_dim == 512 // 8


def test_head_dim_absent_and_hidden_not_divisible_is_refused() -> None:
    with pytest.raises(GeometryError, match=r"head_dim is required: hidden_size \(500\)"):
        ModelGeometry.from_hf_config(cfg(head_dim=None, hidden_size=500))


def test_sliding_pattern_every_nth_layer_full() -> None:
    g = ModelGeometry.from_hf_config(cfg(sliding_window=128, sliding_window_pattern=2))
    assert g.layer_types == (SLIDING, FULL, SLIDING, FULL)


def test_hybrid_layer_types_and_shared_kv_layers() -> None:
    g = ModelGeometry.from_hf_config(cfg(
        layer_types=[SLIDING, FULL, SLIDING, FULL], sliding_window=128,
        num_kv_shared_layers=2))
    assert [layer.kv_source for layer in g.layers] == [0, 1, 0, 1]
    assert kv_bytes_per_token(g) == 2 * 2 * 2 * 64 * 2  # only two layers own a cache


def test_use_sliding_window_false_is_all_full() -> None:
    g = ModelGeometry.from_hf_config(cfg(sliding_window=4096, use_sliding_window=False))
    assert set(g.layer_types) == {FULL}


@pytest.mark.parametrize("field", ["kv_lora_rank", "q_lora_rank"])
def test_latent_attention_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(GeometryError, match=f"^{field} = 512: latent attention"):
        ModelGeometry.from_hf_config(cfg(**{field: 512}))


def test_latent_attention_nested_under_text_config_is_refused() -> None:
    with pytest.raises(GeometryError, match=r"text_config\.kv_lora_rank = 512"):
        ModelGeometry.from_hf_config({"text_config": cfg(kv_lora_rank=512)})


def test_state_space_layers_are_refused() -> None:
    with pytest.raises(GeometryError, match="ssm_state_size = 16: state-space"):
        ModelGeometry.from_hf_config(cfg(ssm_state_size=16))


def test_unknown_layer_type_is_refused_naming_the_entry() -> None:
    with pytest.raises(GeometryError, match=r"layer_types\.1 = 'linear_attention': must be"):
        ModelGeometry.from_hf_config(cfg(layer_types=[FULL, "linear_attention", FULL, FULL]))


def test_max_position_embeddings_is_read_top_level_or_nested() -> None:
    assert ModelGeometry.from_hf_config(cfg(max_position_embeddings=40960)) \
        .max_position_embeddings == 40960
    nested = {"max_position_embeddings": 8192, "text_config": cfg()}
    assert ModelGeometry.from_hf_config(nested).max_position_embeddings == 8192


def test_named_model_reads_name_or_path() -> None:
    assert named_model({"_name_or_path": "Qwen/Qwen3-4B"}) == "Qwen/Qwen3-4B"
    assert named_model({"name_or_path": "a/b"}) == "a/b"
    assert named_model({}) is None
