"""The overlay's comments say what was applied: the gpu_memory_utilization ceiling of the
stack's own slice (settings/accelerator_rules.memory_ceiling, measured or derived), and the
image pinned to the build the chosen boot ran."""

from __future__ import annotations

import tomllib

import pytest

from tests.tune.toy_node import TOY_DIGEST
from tpuserve.accelerators import ACCELERATORS
from tpuserve.settings.accelerator_rules import memory_ceiling
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.node import BootRecord
from tpuserve.tune.result import Summary, overlay_toml
from tpuserve.tune.score import CellFigures, Constraints, Score
from tpuserve.tune.state import Run, TuneState

CHOSEN = Candidate((("max_num_batched_tokens", 4096), ("max_num_seqs", "unset"),
                    ("max_model_len", 32768), ("VLLM_TPU_BUCKET_PADDING_GAP", 0),
                    ("NUM_PRECOMPILE_WORKERS", 1), ("gpu_memory_utilization", 0.93),
                    ("speculative_config", "off")))


def _overlay(accelerator: str, digest: str | None) -> str:
    cell = CellFigures(1024, 16, 1000.0, 0.01, 300.0, 10.0, 90.0, 2)
    score = Score(0.1, 1000.0, 0.01, 300.0, 10.0, 90.0, (), (cell,))
    st = TuneState("flex", "fp", runs={CHOSEN.id: [
        Run(0, 2, BootRecord(True, 800.0, 500.0, False, digest=digest), score)]})
    summary = Summary("flex", 0.6, "[pricing] flex x 1 chip(s)", Constraints(), "w", "done",
                      CHOSEN.id, "terraform", {}, image="vllm/vllm-tpu:nightly",
                      accelerator=accelerator)
    return overlay_toml(summary, CHOSEN, st, {CHOSEN.id: CHOSEN})


@pytest.mark.parametrize("accelerator", ["v5litepod-1", "v5litepod-4"])
def test_the_ceiling_comment_is_the_slices_own(accelerator: str) -> None:
    c = memory_ceiling(ACCELERATORS[accelerator])
    (line,) = [ln for ln in _overlay(accelerator, TOY_DIGEST).splitlines()
               if ln.startswith("allow_untested_gpu_memory_utilization")]
    assert f"ceiling {c.value:g}, {c.source}" in line
    assert ("measured" if c.measured else "derived") in line
    if accelerator == "v5litepod-4":
        assert "0.92" not in line.split(":")[0]  # not the measured slice's figure


def test_the_overlay_pins_the_measured_build_or_says_it_cannot() -> None:
    doc = tomllib.loads(_overlay("v5litepod-1", TOY_DIGEST))
    assert doc["stacks"]["flex"]["vllm"]["image"] == f"vllm/vllm-tpu:nightly@{TOY_DIGEST}"
    text = _overlay("v5litepod-1", None)
    assert "image" not in tomllib.loads(text)["stacks"]["flex"]["vllm"]
    assert "# image: not pinned" in text
