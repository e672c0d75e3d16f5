"""The synth summary labels what is derived in a stack that is not the measured pair (Gemma 4
E2B on v5litepod-1), from the configuration that synthesized it, and says nothing more for the
measured pair; a configuration that does not describe the synthesis is one line and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import synth
from tpuserve.paths import REPO_ROOT
from tpuserve.settings import load
from tpuserve.synth_summary import derived_lines

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 28,
         "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 3072, "intermediate_size": 8192, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": True}
USER = ('[tpu]\naccelerator_type = "v5litepod-4"\n'
        '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
        '[capacity]\nmodel_geometry = "l.json"\nweights_gib = 6.0\n')


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Llama 3.2 3B on v5litepod-4 synthesized: (outdir, the environment that synthesized it)."""
    tmp = tmp_path_factory.mktemp("llama")
    (tmp / "l.json").write_text(json.dumps(LLAMA))
    (tmp / "user.toml").write_text(USER)
    env = {"TPUSERVE_CONFIG": str(tmp / "user.toml")}
    synth(load(environ=env).deployments, tmp / "out")
    return tmp / "out", env


def summary(outdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    return subprocess.run([sys.executable, "-m", "tpuserve.synth_summary", str(outdir)],
                          capture_output=True, text=True, cwd=REPO_ROOT, env={**base, **env},
                          check=False)


def test_the_measured_pair_gets_no_derived_line(synthesized: dict[str, dict[str, Any]]) -> None:
    assert derived_lines(synthesized, environ={}) == []


def test_another_model_on_another_chip_is_labelled_derived(
        llama: tuple[Path, dict[str, str]]) -> None:
    outdir, env = llama
    done = summary(outdir, env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    heads = [line for line in lines if line.startswith("derived, not measured (")]
    # The fleet runs another image (its profile's key differs): two groups, every stack named.
    assert heads and all(
        "meta-llama/Llama-3.2-3B-Instruct on v5litepod-4 is not the measured pair "
        "(google/gemma-4-E2B-it on v5litepod-1, SPEC 1)" in h for h in heads)
    named = {n for h in heads for n in h.split("(", 1)[1].split(")", 1)[0].split(", ")}
    assert named == {"spot", "ondemand", "flex", "fleet"}
    assert ("  vllm.gpu_memory_utilization: derived limit; margin: ceiling 0.89, keeping "
            "1.64 GiB per chip outside the cap") in done.stdout
    assert "/ 15.75 GiB visible per v5e chip" in done.stdout
    assert "  weights_bytes: capacity.weights_gib setting (6.0 GiB)" in done.stdout
    assert ("  throughput: derived: this model's tok/s on this slice, every cell scaled from "
            "measured SPEC 6 (Gemma 4 E2B, v5litepod-1) by bytes per decode step and "
            "bandwidth") in done.stdout
    assert not any(line.startswith("base") and "derived" in line for line in lines)


def test_a_configuration_that_is_not_the_synthesis_is_one_line(
        llama: tuple[Path, dict[str, str]]) -> None:
    # The embedded default (the measured pair) did not synthesize these stacks: the summary
    # cannot tell what is derived, so it says so rather than print them unlabelled.
    outdir, _ = llama
    done = summary(outdir, {})
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert "does not describe this synthesis" in done.stderr
