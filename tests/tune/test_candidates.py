"""Candidates come from the planner and the [tune] table, and none is a config the settings'
validators or the planner refuse: each refused value or combination is dropped with its reason."""

from __future__ import annotations

import pytest

from tests.tune.conftest import flex_space, raw_with
from tpuserve.settings import ConfigError
from tpuserve.settings.loader import deep_merge, from_raw, load_raw
from tpuserve.tune.candidates import NGRAM, context_ladder, default_sets, refusal, space


def test_the_planners_sets_on_e2b_v5e_1() -> None:
    raw = load_raw(environ={})
    d = from_raw(raw).deployments["flex"]
    sets = default_sets(d)
    # At or above the multimodal floor's bucket (2496 -> 4096, SPEC 4).
    assert sets["max_num_batched_tokens"] == [4096, 8192]
    # From the ceiling up to, not including, the measured failure 0.95.
    assert sets["gpu_memory_utilization"] == [0.92, 0.93, 0.94]
    assert sets["NUM_PRECOMPILE_WORKERS"] == [1, 2, 4]
    assert sets["VLLM_TPU_BUCKET_PADDING_GAP"] == [0, 128]
    # E2B's geometry (SPEC 5) does not state max_position_embeddings: the configured length
    # and its double only, and the report says why no longer one is tried.
    assert sets["max_model_len"] == [32768, 65536]
    sp = space(d, raw)
    assert sp.candidates
    reasons = {r.what: r.reason for r in sp.refused}
    assert set(reasons) == {"max_model_len above 65536", f"speculative_config = {NGRAM}"}
    assert "max_position_embeddings" in reasons["max_model_len above 65536"]
    assert sp.baseline.id in {c.id for c in sp.candidates}


def test_refused_values_are_dropped_with_their_reason() -> None:
    _d, raw, sp = flex_space({"max_num_batched_tokens": [2048, 4096],
                              "gpu_memory_utilization": [0.92, 0.94, 0.95],
                              "max_model_len": [32768, 1048576]})
    ids = [c.id for c in sp.candidates]
    assert ids and not any(" b2048" in f" {i}" or "m0.95" in i or "l1048576" in i for i in ids)
    reasons = {r.what: r.reason for r in sp.refused}
    assert "2496" in reasons["max_num_batched_tokens = 2048"]
    assert "died" in reasons["gpu_memory_utilization = 0.95"]
    assert "max_model_len" in reasons["max_model_len = 1048576"]
    # Every candidate kept is a config the real loader takes.
    for c in sp.candidates:
        assert refusal(raw, "flex", c.overlay()) is None
        untested = c.as_dict["gpu_memory_utilization"] > 0.92
        assert c.overlay().get("allow_untested_gpu_memory_utilization", False) is untested


def test_untested_memory_needs_the_allowance_for_that_candidate_only() -> None:
    raw = raw_with({})
    assert refusal(raw, "flex", {"gpu_memory_utilization": 0.93}) is not None
    assert refusal(raw, "flex", {"gpu_memory_utilization": 0.93,
                                 "allow_untested_gpu_memory_utilization": True}) is None


def test_a_slice_with_a_derived_ceiling_gets_no_step_above_it() -> None:
    raw = deep_merge(load_raw(environ={}), {"stacks": {"flex": {
        "tpu": {"accelerator_type": "v6e-1"}}}})
    d = from_raw(raw).deployments["flex"]
    sp = space(d, raw)
    gmus = {c.as_dict["gpu_memory_utilization"] for c in sp.candidates}
    # v6e's derived ceiling (capped at the measured 0.92): 0.93 and 0.94 are refused there.
    assert gmus == {d.vllm.gpu_memory_utilization}
    reasons = {r.what: r.reason for r in sp.refused}
    assert "above the ceiling" in reasons["gpu_memory_utilization = 0.93"]
    assert "derived" in reasons["gpu_memory_utilization = 0.94"]


def test_an_unset_cap_cannot_be_written_over_a_configured_one() -> None:
    raw = deep_merge(raw_with({"max_num_seqs": ["unset", 128]}),
                     {"vllm": {"max_num_seqs": 256}})
    d = from_raw(raw).deployments["flex"]
    sp = space(d, raw)
    assert {c.as_dict["max_num_seqs"] for c in sp.candidates} == {128}
    assert any("TOML has no null" in r.reason for r in sp.refused)


@pytest.mark.parametrize(("tune", "fragment"), [
    ({"gpu_memory_utilization": []}, "tune.gpu_memory_utilization"),
    ({"NUM_PRECOMPILE_WORKERS": [0]}, "tune.NUM_PRECOMPILE_WORKERS"),
    ({"max_num_seqs": ["none"]}, "tune.max_num_seqs"),
    ({"max_ttft_p90_ms": -1.0}, "tune.max_ttft_p90_ms"),
    ({"max_ttft_p90ms": 1.0}, "tune.max_ttft_p90ms"),
])
def test_the_tune_table_is_validated(tune: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_raw(raw_with(tune))
    assert any(fragment in p for p in err.value.problems), err.value.problems


def test_a_combination_refused_only_together_is_dropped() -> None:
    # 131072 fits one request's KV at 0.92, 0.7 serves 32768; together the pool is too small.
    _d, _raw, sp = flex_space({"max_model_len": [32768, 131072],
                               "gpu_memory_utilization": [0.92, 0.7]})
    pairs = {(c.as_dict["max_model_len"], c.as_dict["gpu_memory_utilization"])
             for c in sp.candidates}
    assert (131072, 0.7) not in pairs and {(131072, 0.92), (32768, 0.7)} <= pairs
    assert any("l131072" in r.what and "m0.7" in r.what and "KV tokens" in r.reason
               for r in sp.refused)


def test_speculative_decoding_is_searched_only_where_the_settings_take_it() -> None:
    # Not allowed by the stack: n-gram is in the planner's set, refused (fail closed) and
    # listed with what upstream shows, where it says so.
    d, raw, sp = flex_space({})
    assert default_sets(d)["speculative_config"] == ["off", NGRAM]
    assert not any(c.id.endswith("dngram4") for c in sp.candidates)
    (why,) = [r.reason for r in sp.refused if "speculative" in r.what]
    assert "allow_untested_speculative_config" in why
    assert "vllm-project/tpu-inference" in why and "not on google/gemma-4-E2B-it" in why
    assert "not proved for the pinned image" in why
    # Listed in [tune] without the allowance: refused with the settings' one line.
    _d, _raw, sp = flex_space({"speculative_config": [
        "off", {"method": "ngram", "num_speculative_tokens": 4}]})
    assert next(r.reason for r in sp.refused if "speculative" in r.what).count(
        "allow_untested_speculative_config") == 1
    # Allowed by the stack: n-gram candidates beside every other, each overlay valid.
    raw = deep_merge(raw_with({"max_num_batched_tokens": [4096], "max_model_len": [32768],
                               "NUM_PRECOMPILE_WORKERS": [1], "gpu_memory_utilization": [0.92],
                               "VLLM_TPU_BUCKET_PADDING_GAP": [0], "max_num_seqs": ["unset"]}),
                     {"stacks": {"flex": {"vllm": {"allow_untested_speculative_config": True}}}})
    d = from_raw(raw).deployments["flex"]
    sp = space(d, raw)
    ids = sorted(c.id for c in sp.candidates)
    assert ids == ["b4096 s- l32768 g0 w1 m0.92", "b4096 s- l32768 g0 w1 m0.92 dngram4"]
    spec = next(c for c in sp.candidates if c.id.endswith("dngram4"))
    assert spec.overlay()["speculative_config"]["method"] == "ngram"
    assert refusal(raw, "flex", spec.overlay()) is None


def _model(model: str, max_model_len: int) -> tuple[object, dict[str, object]]:
    """MODEL at MAX_MODEL_LEN, [tune] holding every set but the context's and memory's to one
    value (fewer combinations to validate; the ladder is the planner's)."""
    one = {"max_num_batched_tokens": [4096], "max_num_seqs": ["unset"],
           "VLLM_TPU_BUCKET_PADDING_GAP": [0], "NUM_PRECOMPILE_WORKERS": [1],
           "speculative_config": ["off"]}
    raw = deep_merge(load_raw(environ={}), {"vllm": {"model": model,
                                                     "max_model_len": max_model_len},
                                            "tune": one})
    return from_raw(raw).deployments["flex"], raw


def test_the_context_ladder_stops_at_the_models_trained_context() -> None:
    # gemma-2b-it: max_position_embeddings 8192 (its config.json), KV far larger.
    d, raw = _model("google/gemma-2b-it", 2048)
    assert default_sets(d)["max_model_len"] == [2048, 4096, 8192, 16384]
    sp = space(d, raw)
    assert {c.as_dict["max_model_len"] for c in sp.candidates} == {2048, 4096, 8192}
    why = next(r.reason for r in sp.refused if r.what == "max_model_len = 16384")
    assert "max_position_embeddings (8,192" in why


def test_the_context_ladder_stops_at_what_one_requests_kv_allows() -> None:
    # granite-3b (320 KiB of KV per token): the pool, not its 128,000 trained tokens, bounds
    # the ladder; the top step does not fit at the configured 0.92, so it is kept only above.
    d, raw = _model("ibm-granite/granite-3b-code-instruct-128k", 8192)
    ladder = context_ladder(d, 0.94)
    assert ladder[:2] == [8192, 16384] and 16384 < ladder[2] <= 27136 < ladder[3]
    sp = space(d, raw)
    top = {c.as_dict["gpu_memory_utilization"] for c in sp.candidates
           if c.as_dict["max_model_len"] == ladder[2]}
    assert top and 0.92 not in top and 0.94 in top
    assert any(r.what == f"max_model_len = {ladder[3]}" and "KV tokens" in r.reason
               for r in sp.refused)
    assert any(f"l{ladder[2]}" in r.what and "m0.92" in r.what for r in sp.refused)
