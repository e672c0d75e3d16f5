"""Another model is sized from its own files and flags, never E2B's; one line per refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuserve.facts import GiB
from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.model_inputs import plan_sources

# Shaped like Qwen3-4B's published geometry (36 layers, 32 query / 8 KV heads, head_dim 128).
QWEN = {"_name_or_path": "Qwen/Qwen3-4B", "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "hidden_size": 2560, "intermediate_size": 9728, "vocab_size": 151936,
        "max_position_embeddings": 40960, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": True}
INDEX = {"metadata": {"total_size": 8_044_936_192},
         "weight_map": {"model.embed_tokens.weight": "model-00001-of-00003.safetensors"}}


def load(tmp_path: Path, toml: str, files: dict[str, Any] | None = None) -> Any:
    for name, doc in (files or {}).items():
        (tmp_path / name).write_text(json.dumps(doc))
    (tmp_path / "user.toml").write_text(toml)
    return from_raw(load_raw(environ={"TPUSERVE_CONFIG": str(tmp_path / "user.toml")}))


def problems(tmp_path: Path, toml: str, files: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, toml, files)
    return exc.value.problems


QWEN_TOML = '[vllm]\nmodel = "Qwen/Qwen3-4B"\n'


def test_another_model_alone_is_refused_naming_both_settings(tmp_path: Path) -> None:
    lines = problems(tmp_path, QWEN_TOML)
    assert all("\n" not in line for line in lines)
    assert any("vllm.model = 'Qwen/Qwen3-4B': no geometry" in p
               and "capacity.model_geometry" in p for p in lines)
    assert any("no weights figure" in p and "capacity.weights_gib" in p
               and "capacity.weights_index" in p and "SPEC 5" in p for p in lines)


def test_geometry_without_weights_is_refused(tmp_path: Path) -> None:
    lines = problems(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n',
                     {"q.json": QWEN})
    assert len({p.split("] ", 1)[1] for p in lines}) == 1
    assert "no weights figure" in lines[0]


def test_geometry_of_another_model_is_refused(tmp_path: Path) -> None:
    lines = problems(tmp_path, '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
                     '[capacity]\nmodel_geometry = "q.json"\nweights_gib = 7.5\n',
                     {"q.json": QWEN})
    assert any("the file names 'Qwen/Qwen3-4B' but vllm.model = "
               "'meta-llama/Llama-3.2-3B-Instruct'" in p for p in lines)


def test_both_weights_figures_are_refused(tmp_path: Path) -> None:
    lines = problems(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                     'weights_gib = 7.5\nweights_index = "i.json"\n',
                     {"q.json": QWEN, "i.json": INDEX})
    assert any("capacity.weights_gib = 7.5 and capacity.weights_index" in p
               and "not both" in p for p in lines)


@pytest.mark.parametrize(("index", "why"), [
    ({"metadata": {"total_size": True}, "weight_map": {"a": "b"}}, "metadata.total_size = true"),
    ({"metadata": {"total_size": 8.0e9}, "weight_map": {"a": "b"}}, "metadata.total_size = 8"),
    ({"metadata": {}, "weight_map": {"a": "b"}}, "metadata.total_size = null"),
    ({"metadata": {"total_size": 5}, "weight_map": {}}, "weight_map is missing or empty"),
])
def test_a_bad_index_is_refused_naming_the_field(tmp_path: Path, index: Any, why: str) -> None:
    lines = problems(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                     'weights_index = "i.json"\n', {"q.json": QWEN, "i.json": index})
    assert any("capacity.weights_index = " in p and why in p for p in lines)


def test_weights_index_gives_total_size_labelled_derived(tmp_path: Path) -> None:
    loaded = load(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                  'weights_index = "i.json"\n', {"q.json": QWEN, "i.json": INDEX})
    d = loaded.deployments["spot"]
    plan = plan_for(d)
    assert plan.budget.weights_bytes == 8_044_936_192
    assert plan.kv_bytes_per_token == 36 * 2 * 8 * 128 * 2  # its own geometry, not E2B's 18,432
    assert plan.measured_tpot_ms is None  # SPEC 5's TPOT is E2B's
    sources = plan_sources(d)
    assert sources["weights_bytes"].startswith("derived from capacity.weights_index")
    assert "metadata.total_size" in sources["weights_bytes"]
    assert sources["kv_bytes_per_token"].startswith("derived")
    assert sources["capacity_rules"].startswith("derived")


def test_weights_gib_is_labelled_the_setting(tmp_path: Path) -> None:
    loaded = load(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                  'weights_gib = 7.5\n', {"q.json": QWEN})
    d = loaded.deployments["spot"]
    assert plan_for(d).budget.weights_bytes == round(7.5 * GiB)
    assert plan_sources(d)["weights_bytes"] == "capacity.weights_gib setting (7.5 GiB)"


def test_max_model_len_above_the_models_context_is_refused(tmp_path: Path) -> None:
    lines = problems(tmp_path, '[vllm]\nmodel = "Qwen/Qwen3-4B"\nmax_model_len = 65536\n'
                     '[capacity]\nmodel_geometry = "q.json"\nweights_gib = 7.5\n',
                     {"q.json": QWEN})
    assert any("vllm.max_model_len = 65536: above the model's max_position_embeddings "
               "(40,960" in p for p in lines)


def test_another_model_gets_its_profile_not_gemmas_parsers(tmp_path: Path) -> None:
    loaded = load(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                  'weights_gib = 7.5\n', {"q.json": QWEN})
    v = loaded.deployments["spot"].vllm
    assert (v.tool_call_parser, v.reasoning_parser, v.limit_mm_per_prompt) == \
        ("hermes", "qwen3", {})
    assert plan_sources(loaded.deployments["spot"])["profile"].startswith("derived")


def test_a_model_without_a_profile_gets_no_parser_and_text_only(tmp_path: Path) -> None:
    llama = {**QWEN, "_name_or_path": "meta-llama/Llama-3.2-3B-Instruct"}
    loaded = load(tmp_path, '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
                  '[capacity]\nmodel_geometry = "l.json"\nweights_gib = 6\n', {"l.json": llama})
    d = loaded.deployments["spot"]
    v = d.vllm
    assert (v.enable_auto_tool_choice, v.tool_call_parser, v.reasoning_parser,
            v.limit_mm_per_prompt) == (False, None, None, {})
    assert plan_sources(d)["profile"].startswith("none: no profile")


def test_the_users_parser_wins_over_the_profile(tmp_path: Path) -> None:
    loaded = load(tmp_path, QWEN_TOML + 'tool_call_parser = "qwen3_xml"\n'
                  '[capacity]\nmodel_geometry = "q.json"\nweights_gib = 7.5\n',
                  {"q.json": QWEN})
    assert loaded.deployments["spot"].vllm.tool_call_parser == "qwen3_xml"


def test_default_model_keeps_its_measured_figures_and_merged_limits(tmp_path: Path) -> None:
    loaded = load(tmp_path, '[vllm]\nlimit_mm_per_prompt = { image = 0 }\n')
    d = loaded.deployments["spot"]
    assert d.vllm.limit_mm_per_prompt == {"image": 0, "audio": 1}
    assert d.vllm.tool_call_parser == "gemma4"
    assert all(s.startswith("measured") for name, s in plan_sources(d).items())


def test_the_multimodal_floor_is_a_derived_limit_for_another_model(tmp_path: Path) -> None:
    lines = problems(tmp_path, QWEN_TOML + 'limit_mm_per_prompt = { image = 1 }\n'
                     'max_num_batched_tokens = 1024\n'
                     '[capacity]\nmodel_geometry = "q.json"\nweights_gib = 7.5\n',
                     {"q.json": QWEN})
    floor = [p for p in lines if "vllm.max_num_batched_tokens" in p]
    assert floor and "derived for Qwen/Qwen3-4B: measured for Gemma 4 E2B" in floor[0]
    assert "margin:" in floor[0]


def test_the_multimodal_floor_stays_measured_for_the_default(tmp_path: Path) -> None:
    lines = problems(tmp_path, '[vllm]\nmax_num_batched_tokens = 1024\n')
    floor = [p for p in lines if "vllm.max_num_batched_tokens" in p]
    assert floor and "derived" not in floor[0]


def test_another_models_serve_flags_carry_none_of_gemmas(tmp_path: Path) -> None:
    from tpuserve.render.vllm_args import serve_argv

    loaded = load(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                  'weights_gib = 7.5\n', {"q.json": QWEN})
    argv = serve_argv(loaded.deployments["spot"].vllm)
    assert "Qwen/Qwen3-4B" in argv and "gemma4" not in argv
    assert "--limit-mm-per-prompt" not in argv
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"


def test_another_model_synthesizes_every_stack(tmp_path: Path) -> None:
    from tests.conftest import synth

    loaded = load(tmp_path, QWEN_TOML + '[capacity]\nmodel_geometry = "q.json"\n'
                  'weights_gib = 7.5\n', {"q.json": QWEN})
    stacks = synth(loaded.deployments, tmp_path / "out")
    assert {"spot", "ondemand", "flex", "fleet"} <= set(stacks)
    assert "Qwen/Qwen3-4B" in json.dumps(stacks["spot"])
