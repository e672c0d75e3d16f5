"""`tpuserve tune flex --budget-usd 5` with the planner's own candidates (no [tune] table: 144
of them, n-gram refused) on the simulated server, end to end as test_tune_end_to_end runs it:
the run ends with an overlay, a report and a chart whose chosen config is the simulator's
optimum, within the budget.

The oracle is the simulator's model over the same grid, written out here (support.with_flags,
not rendered by tpuserve). Seed 0 is chosen because its optimum's batched tokens, padding gap
and memory utilization serve 9% better than the best config with any other three, while a
search that ran memory after the programs stopped at the padding gap and 0.92 (the gap's
programs do not fit higher; tune/plan.py says why memory now comes first). The sequence cap and
the context length move this seed's tok/s by under 1.5%, inside the benchmark's noise (a
repetition's cv near 1%, SPEC 6): there the test asks for a config within 2% of the optimum's
tok/s, not for the very one.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from pathlib import Path

import pytest

from tests.cli_support import is_png
from tests.sim import response_model as rm
from tests.sim.support import REAL_PROXY, sim_optimum, with_flags
from tests.sim.tune_support import CLIENTS, CONTEXT, OUTPUT, sim_flex

E2E_ENV = "TPUSERVE_TUNE_E2E"
pytestmark = [REAL_PROXY, pytest.mark.skipif(
    os.environ.get(E2E_ENV) != "1",
    reason=f"runs alone (timing): {E2E_ENV}=1 ./dev test tests/sim/test_tune_default_set.py "
           "-n 0, as .ci/run does")]

SEED = 0
Key = tuple[int, int, int, float, int]  # batched tokens, seqs, padding gap, memory, context
# The planner's serving values on E2B/v5litepod-1 (docs/tune.md): the workers change no
# serving, so they are not in the oracle's grid.
GRID: dict[Key, rm.Config] = {
    (b, s, g, u, ml): with_flags(max_num_batched_tokens=b, max_num_seqs=s, padding_gap=g,
                                 gpu_memory_utilization=u, max_model_len=ml)
    for b, s, g, u, ml in itertools.product((4096, 8192), (rm.DEFAULT_SEQS, 128), (0, 128),
                                            (0.92, 0.93, 0.94), (32768, 65536))}
NOISE = 1.02  # twice a repetition's cv (SPEC 6), as tune/plan.py's BOOT_TOLERANCE


def _big_three(k: Key) -> tuple[int, int, float]:
    return k[0], k[2], k[3]


def _chosen(overlay: dict) -> Key:
    v = overlay["stacks"]["flex"]["vllm"]
    env = v.get("env", {})
    return (v.get("max_num_batched_tokens", 4096), v.get("max_num_seqs", rm.DEFAULT_SEQS),
            env.get("VLLM_TPU_BUCKET_PADDING_GAP", 0), v.get("gpu_memory_utilization", 0.92),
            v.get("max_model_len", 32768))


def test_the_default_candidates_end_with_the_simulators_optimum(tmp_path: Path) -> None:
    best, cells = sim_optimum(SEED, GRID, CONTEXT, CLIENTS, OUTPUT)
    assert best is not None
    top = cells[best]
    assert top is not None
    others = [c.tok_s for k, c in cells.items()
              if c is not None and _big_three(k) != _big_three(best)]
    assert top.tok_s >= 1.08 * max(others)  # what the seed was chosen for (see above)
    with sim_flex(tmp_path, SEED, tune="") as s:
        r = s.tune("--budget-usd", "5", timeout=1500)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        said = " ".join(r.stderr.split())
        assert "tune flex: 144 candidates" in said, said
        assert doc["node_on"] == "terraform"
        chosen = _chosen(tomllib.loads(Path(doc["overlay"]).read_text()))
        got = cells[chosen]
        assert got is not None, chosen
        assert _big_three(chosen) == _big_three(best), (chosen, best)
        assert got.tok_s * NOISE >= top.tok_s, (chosen, got.tok_s, best, top.tok_s)
        report = Path(doc["report"]).read_text()
        assert "n-gram" in report or "ngram" in report  # refused, with upstream's record
        assert is_png(Path(doc["chart"]).read_bytes())
        state = s.state()
        assert state["done"] and state["spent_s"] / 3600 * s.d.usd_per_hour <= 5.0
        print(f"\ndefault set, seed {SEED}: chosen {chosen} ({got.tok_s:.1f} tok/s modelled), "
              f"optimum {best} ({top.tok_s:.1f}); {sum(len(v) for v in state['runs'].values())}"
              f" runs, {state['spent_s']:.0f} node-s")
