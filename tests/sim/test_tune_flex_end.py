"""A flex node's run ending mid-search, on the simulated server: the queued resource is
suspended while a candidate is being benchmarked (the TPU API then answers NOT_FOUND for the
node, its VM's processes die), so the benchmark's requests fail; the tuner asks the TPU API,
takes the NOT_FOUND as proof the node is gone (not that the candidate failed), saves its state
and says so. Terraform re-creates the queued resource: a new node boots Terraform's script from
an empty disk, and the same command resumes the search there, the interrupted candidate first,
its boot a compile-cache hit (its programs were published to the bucket before it was
measured). Gated like test_tune_end_to_end.py (it paces real requests): run alone.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.render.boot.support import NAMESPACE, wait_for
from tests.sim.support import REAL_PROXY
from tests.sim.tune_support import SimFlex, end_flex_run, next_flex_node, sim_flex
from tpuserve.ops.reconverge import parse_reconverge
from tpuserve.tune.tpu_node import sha256

E2E_ENV = "TPUSERVE_TUNE_E2E"
pytestmark = [REAL_PROXY, pytest.mark.skipif(
    os.environ.get(E2E_ENV) != "1",
    reason=f"runs alone (timing): {E2E_ENV}=1 ./dev test tests/sim/test_tune_flex_end.py -n 0")]

# One candidate (seed 8 boots it): the search is one boot, so the test is the flex end and the
# resume, not the search (test_tune_end_to_end.py holds that).
CANDIDATE = "b4096 s- l32768 g0 w1 m0.94"
TUNE = """
[tune]
max_num_batched_tokens = [4096]
gpu_memory_utilization = [0.94]
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1]
"""


def _generated(s: SimFlex) -> float:
    """Tokens the node's simulated vLLM has streamed (its /metrics, behind the proxy)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{s.backend_port}/metrics",
                                    timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def _applied(s: SimFlex, script: str) -> bool:
    word = parse_reconverge(s.cloud.metadata.namespace(NAMESPACE))
    return word is not None and word.state == "applied" and word.script_sha256 == sha256(script)


def test_a_flex_run_ending_mid_benchmark_saves_the_state_and_the_next_node_resumes_warm(
        tmp_path: object) -> None:
    with sim_flex(tmp_path, 8, TUNE) as s:  # type: ignore[arg-type]
        script = s.scripts()[CANDIDATE]
        proc = s.start("--budget-usd", "5")
        try:
            wait_for(lambda: _applied(s, script), "the candidate booted", timeout=120)
            wait_for(lambda: _generated(s) > 0, "the candidate's benchmark under way",
                     timeout=60)
            end_flex_run(s)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        state = s.state()
        # Neither recorded (as failed) nor dropped: still pending at rung 0; the next node
        # boots Terraform's script.
        assert state["pending"] == [CANDIDATE] and CANDIDATE not in state["runs"], state
        assert state["settled"] is True and state["node_on"] == "terraform"
        said = " ".join(err.split())
        assert proc.returncode == 1, err
        assert json.loads(out)["status"] == "node-gone"
        assert "the node went away" in said and "the state is saved" in said, said
        assert "does not exist (NOT_FOUND)" in said
        assert "failed:" not in said  # never recorded as the candidate's failure
        assert state["spent_s"] > 0  # the lost node's boot is counted

        with next_flex_node(s) as s2:
            assert s2.node_script() == s.scripts()["terraform"]  # booted from scratch
            r = s2.tune("--budget-usd", "5")
            assert r.returncode == 0, r.stderr
            assert "resuming" in r.stderr
            doc = json.loads(r.stdout)
            assert doc["best"] == CANDIDATE and doc["node_on"] == "terraform"
            # The next node ran the interrupted candidate first, then Terraform's again.
            assert s2.link.scripts == [s.scripts()["terraform"], script,
                                       s.scripts()["terraform"]]
            [run] = s2.state()["runs"][CANDIDATE]  # once, at the rung it was cut from
            assert run["rung"] == 0 and run["error"] is None
            # The boot phases' cache word: its programs came from the bucket.
            assert run["boot"]["cache_hit"] is True, run["boot"]
            cache = dict(run["boot"]["phases"])
            assert "cache" in cache
            assert _applied(s2, s.scripts()["terraform"])
