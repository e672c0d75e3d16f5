"""SPEC 4's boot times (857 s cold, 497 s warm) were measured for Gemma 4 E2B on v5litepod-1:
the review labels them derived on any other model or chip, and states them as SPEC 4's on the
measured pair, as before."""

from __future__ import annotations

from pathlib import Path

from tests.review.test_review_derived import facts, review_of
from tpuserve.paths import REPO_ROOT
from tpuserve.review.config_facts import config_facts
from tpuserve.review.effects import DERIVED_TIMES, with_effects
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import ResourceChange

LLAMA_V5E4 = ('[tpu]\naccelerator_type = "v5litepod-4"\n'
              '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\nmax_model_len = {n}\n'
              '[capacity]\nmodel_geometry = "l.json"\nweights_index = "i.json"\n')
QUEUED = "terraform_data.queued_resource"


def test_another_models_cache_key_change_says_the_times_are_e2bs(tmp_path: Path) -> None:
    base = facts(tmp_path, LLAMA_V5E4.format(n=4096), "base.toml")
    head = facts(tmp_path, LLAMA_V5E4.format(n=8192), "head.toml")
    md = render_markdown(review_of(base, head))
    line = next(x for x in md.splitlines() if "compile-cache key changes" in x)
    assert "~857 s instead of ~497 s on the next boot" in line
    assert line.endswith(DERIVED_TIMES)
    assert "Gemma 4 E2B's on v5litepod-1" in DERIVED_TIMES and "derived" in DERIVED_TIMES


def test_the_measured_pair_states_spec_4_alone(tmp_path: Path) -> None:
    default = config_facts(REPO_ROOT, {})
    shorter = facts(tmp_path, "[vllm]\nmax_model_len = 4096\n")
    md = render_markdown(review_of(default, shorter))
    line = next(x for x in md.splitlines() if "compile-cache key changes" in x)
    assert line.endswith("on the next boot, SPEC 4") and DERIVED_TIMES not in md


def test_a_server_effect_labels_e2bs_times_for_another_chip(tmp_path: Path) -> None:
    head = facts(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n').stacks["flex"]
    default = config_facts(REPO_ROOT, {}).stacks["flex"]
    added = (ResourceChange(QUEUED, "added"),)
    [derived] = with_effects(added, None, None, None, head, "added")
    [measured] = with_effects(added, None, None, None, default, "added")
    assert derived.effect is not None and measured.effect is not None
    assert "~857 s" in derived.effect.why and derived.effect.why.endswith(DERIVED_TIMES)
    assert DERIVED_TIMES not in measured.effect.why and "~857 s" in measured.effect.why
