"""The tuner's tests: a config restricted by [tune], its candidate space, a toy node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tune.toy_node import ToyNode, base_values
from tpuserve.settings.loader import deep_merge, from_raw, load_raw
from tpuserve.tune.candidates import Space, sets_for, space
from tpuserve.tune.runner import Budget, Tuner
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TuneState, save
from tpuserve.tune.workload import Workload

TUNE = {"max_num_batched_tokens": [4096, 8192], "max_num_seqs": ["unset", 128],
        "max_model_len": [32768, 65536], "VLLM_TPU_BUCKET_PADDING_GAP": [0, 128],
        "NUM_PRECOMPILE_WORKERS": [1, 4], "gpu_memory_utilization": [0.92, 0.93, 0.94]}
WORKLOAD = Workload((1024, 8192), (1, 16))


def raw_with(tune: dict[str, Any] | None = None) -> dict[str, Any]:
    return deep_merge(load_raw(environ={}), {"tune": TUNE if tune is None else tune})


def flex_space(tune: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any], Space]:
    raw = raw_with(tune)
    d = from_raw(raw).deployments["flex"]
    return d, raw, space(d, raw)


MakeTuner = Callable[..., tuple[Tuner, ToyNode, Space]]


@pytest.fixture
def make_tuner(tmp_path: Path) -> MakeTuner:
    def make(seed: int, *, limits: Constraints | None = None, budget: Budget | None = None,
             keep_best: bool = False, state: TuneState | None = None,
             node: ToyNode | None = None) -> tuple[Tuner, ToyNode, Space]:
        d, _raw, sp = flex_space()
        node = node or ToyNode(seed, sets_for(d), base_values(d))
        ids = [c.id for c in sp.candidates]
        st = state or TuneState("flex", "fp", at_rung=list(ids), pending=list(ids))
        path = tmp_path / "state.json"
        tuner = Tuner(node, {c.id: c for c in sp.candidates}, st,
                      save=lambda s: save(s, path), usd_per_hour=d.usd_per_hour,
                      limits=limits or Constraints(), workload=WORKLOAD, budget=budget,
                      keep_best=keep_best)
        return tuner, node, sp

    return make


def boot_order(make_tuner: MakeTuner, seed: int) -> list[str]:
    """The ids an uninterrupted run on SEED's toy node boots, in the order it first boots each
    (a later boot of the same id, a rung's or a return's, is not a new entry): what the
    interruption tests count in, so they follow the plan's order rather than the list's."""
    tuner, node, _sp = make_tuner(seed)
    tuner.run()
    of = {json.dumps(c.overlay(), sort_keys=True): cid for cid, c in tuner.candidates.items()}
    out: list[str] = []
    for op, overlay in node.log:
        if op == "apply" and (cid := of[json.dumps(overlay, sort_keys=True)]) not in out:
            out.append(cid)
    return out
