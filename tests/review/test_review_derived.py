"""The plan review labels what is derived: a deployment that is not the measured pair (Gemma 4
E2B on v5litepod-1) has its figures and rules marked derived, from what and with what margin;
the measured pair's review has no such label and is as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuserve.paths import REPO_ROOT
from tpuserve.review.compare import build_review
from tpuserve.review.config_facts import config_facts
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import Review, render_json
from tpuserve.review.revision_facts import ConfigFacts, RevisionFacts, Synthesis
from tpuserve.settings.flag_rules import rule_for

# Shaped like meta-llama/Llama-3.2-3B-Instruct's published geometry (28 layers, 24/8 heads).
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 28,
         "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 3072, "intermediate_size": 8192, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": True}
INDEX = {"metadata": {"total_size": 6_425_499_648}, "weight_map": {"lm": "model-1.safetensors"}}


def facts(tmp_path: Path, toml: str | None, name: str = "user.toml") -> ConfigFacts:
    """This checkout's config/ read by the current code, with TOML as the user's file."""
    if toml is None:
        return config_facts(REPO_ROOT, {})
    (tmp_path / "l.json").write_text(json.dumps(LLAMA))
    (tmp_path / "i.json").write_text(json.dumps(INDEX))
    (tmp_path / name).write_text(toml)
    out = config_facts(REPO_ROOT, {"TPUSERVE_CONFIG": str(tmp_path / name)})
    assert not out.problems, out.problems
    return out


def review_of(base: ConfigFacts, head: ConfigFacts) -> Review:
    none = Synthesis({})
    return build_review(RevisionFacts("base", "a" * 40, none, base),
                        RevisionFacts("head", "b" * 40, none, head))


def stack_json(r: Review, name: str) -> dict[str, Any]:
    data = json.loads(render_json(r))
    return next(s for s in data["stacks"] if s["name"] == name)


@pytest.fixture(scope="module")
def default_facts() -> ConfigFacts:
    return config_facts(REPO_ROOT, {})


def test_the_measured_pair_has_no_derived_label(default_facts: ConfigFacts) -> None:
    for f in default_facts.stacks.values():
        assert (f.derived, f.rule_labels, f.weights_label) == ({}, {}, "weights (measured)")
    r = review_of(default_facts, default_facts)
    data = json.loads(render_json(r))
    assert all("derived" not in s for s in data["stacks"])
    md = render_markdown(r)
    assert "derived" not in md.lower()


def test_another_chip_marks_the_ceiling_derived_with_its_margin(
        tmp_path: Path, default_facts: ConfigFacts) -> None:
    # The default model on v5litepod-4: the chip is not the measured one, its ceiling derived.
    head = facts(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n')
    r = review_of(default_facts, head)
    spot = stack_json(r, "spot")
    assert spot["derived"]["base"] == []
    derived = {d["name"]: d["source"] for d in spot["derived"]["head"]}
    assert derived["deployment"].startswith(
        "google/gemma-4-E2B-it on v5litepod-4 is not the measured pair "
        "(google/gemma-4-E2B-it on v5litepod-1, SPEC 1)")
    ceiling = derived["vllm.gpu_memory_utilization"]
    assert "ceiling 0.89, keeping 1.64 GiB per chip outside the cap" in ceiling
    assert "/ 15.75 GiB visible per v5e chip" in ceiling
    # The flag that changes (0.92 -> the derived 0.89) carries the derived rule, not the
    # measured one as it stands.
    flags = {f["name"]: f for f in spot["argv"]}
    gmu = flags["--gpu-memory-utilization"]
    assert (gmu["old"], gmu["new"]) == ("0.92", "0.89")
    assert gmu["rule"].startswith("derived for google/gemma-4-E2B-it on v5litepod-4 from the "
                                  "rule measured for google/gemma-4-E2B-it on v5litepod-1: ")
    assert rule_for("--gpu-memory-utilization").rule in gmu["rule"]  # the same Rule's note
    assert "; margin: ceiling 0.89" in gmu["rule"]
    assert flags["--tensor-parallel-size"]["rule"].startswith("derived for ")
    md = render_markdown(r)
    section = md[md.index("### `spot`"):md.index("### `ondemand`")]
    assert "**Derived, not measured** (head):" in section
    assert "- `vllm.gpu_memory_utilization`: derived limit; margin: ceiling 0.89" in section
    assert "| option | base | head | rule (derived where it says so) |" in section
    assert "| measured rule |" not in section


def test_another_model_marks_its_figures_and_rules_derived(
        tmp_path: Path, default_facts: ConfigFacts) -> None:
    # Another model on the measured chip: the chip's 0.92 is measured, for E2B's programs only.
    head = facts(tmp_path, '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
                           '[capacity]\nmodel_geometry = "l.json"\nweights_index = "i.json"\n')
    r = review_of(default_facts, head)
    spot = stack_json(r, "spot")
    derived = {d["name"]: d["source"] for d in spot["derived"]["head"]}
    assert derived["weights_bytes"].startswith("derived from capacity.weights_index")
    assert derived["kv_bytes_per_token"].startswith("derived")  # not masked as a secret
    assert derived["throughput"].startswith("derived: this model's tok/s on this slice, every "
                                            "cell scaled from measured SPEC 6")
    assert "hbm" not in derived  # v5e's HBM is measured
    assert "what Gemma 4 E2B's compiled programs took on v5litepod-1" in derived[
        "vllm.gpu_memory_utilization"]
    # A text-only model (no profile, no multimodal item): no multimodal floor to label.
    assert "vllm.max_num_batched_tokens" not in derived
    # The weights row says each side's source, never "measured" for the derived one.
    weights = next(d for d in spot["capacity"] if d["key"] == "weights_bytes")
    assert weights["label"] == "weights (measured) → weights (derived: index total_size)"
    model = next(f for f in spot["argv"] if f["name"] == "model")
    assert model["rule"].startswith("derived for meta-llama/Llama-3.2-3B-Instruct on "
                                    "v5litepod-1 from the rule measured for")


def test_a_change_back_to_the_measured_pair_labels_the_base_side(
        tmp_path: Path, default_facts: ConfigFacts) -> None:
    base = facts(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n')
    r = review_of(base, default_facts)
    spot = stack_json(r, "spot")
    assert spot["derived"]["head"] == [] and spot["derived"]["base"]
    # HEAD runs on the measured pair: its flags' rules are the measured ones, as they are.
    gmu = next(f for f in spot["argv"] if f["name"] == "--gpu-memory-utilization")
    assert gmu["rule"] == rule_for("--gpu-memory-utilization").rule
    md = render_markdown(r)
    assert "**Derived, not measured** (base):" in md


def test_both_sides_derived_alike_are_listed_once(tmp_path: Path) -> None:
    llama = ('[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
             '[capacity]\nmodel_geometry = "l.json"\nweights_index = "i.json"\n')
    base = facts(tmp_path, llama, "base.toml")
    head = facts(tmp_path, llama + "[stacks.spot.vllm]\nmax_model_len = 16384\n", "head.toml")
    md = render_markdown(review_of(base, head))
    section = md[md.index("### `spot`"):]
    assert "**Derived, not measured** (base and head):" in section
    assert "(base):" not in section and "(head):" not in section
    assert ("| `--max-model-len` (`vllm.max_model_len`) | `32768` | `16384` | derived for "
            "meta-llama/Llama-3.2-3B-Instruct on v5litepod-1 from the rule measured for"
            ) in section
