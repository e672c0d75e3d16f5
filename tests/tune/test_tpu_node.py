"""The TPU-API TuneNode against the fake TPU API: a config is applied by a nodes.patch of the
startup-script metadata (the script its settings render), its boot read from the watcher's
`reconverge` word for that script's sha256 and the boot phases; a failed word, a node that
went away and a watcher that never answers each end the wait."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.tpu_api import FakeTpuApi
from tests.gcp.tpu_support import Clock
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.ops.bench_stats import CellStats, RepStats
from tpuserve.ops_error import OpsError
from tpuserve.render.boot_script import render_startup
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune.candidates import space
from tpuserve.tune.node import CandidateFailed, Measurement, NodeGone, NodeUnproven
from tpuserve.tune.runner import DONE, NODE_GONE, Tuner
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TERRAFORM, TuneState, load, save
from tpuserve.tune.tpu_node import TpuNode
from tpuserve.tune.workload import Workload

PROJECT, ZONE = "proj-test-1", "us-west4-a"
PHASES = {
    "boot": "2030-01-01T10:00:00Z started",
    "cache": "2030-01-01T10:00:02Z {cache} object_bytes=1 files=2 bytes=3",
    "container": "2030-01-01T10:01:05Z started",
    "kv_cache": "2030-01-01T10:01:40Z blocks=5021",
    "startup_complete": "2030-01-01T10:12:45Z seen",
    "health": "2030-01-01T10:12:46Z ok",
    "state": "2030-01-01T10:12:46Z ready",
}


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as server:
        yield server


WORKLOAD = Workload((1024,), (4,), 16)
REP = {"requests": 4, "errors": 0, "output_tokens": 64, "span_s": 1.0,
       "output_tokens_per_s": 64.0, "ttft_ms_median": 90.0, "ttft_ms_p90": 120.0,
       "tpot_ms_median": 12.0, "per_stream_tokens_per_s": 16.0, "prompt_tokens_mean": 1024.0}


def _seed(api: FakeTpuApi, d: Any) -> None:
    api.seed_node(PROJECT, ZONE, d.node_name, spec={
        "acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite",
        "networkConfig": {"network": "default", "enableExternalIps": True},
        "metadata": {"startup-script": render_startup(d), "enable-oslogin": "TRUE"}})


def _cell() -> CellStats:
    return CellStats(1024, 4, (RepStats(**REP),))


@pytest.fixture
def env(api: FakeTpuApi) -> dict[str, Any]:
    raw = load_raw(environ={"TPUSERVE_PROJECT": PROJECT, "TPUSERVE_ZONE": ZONE})
    d = from_raw(raw).deployments["spot"]
    _seed(api, d)
    clock = Clock()
    tpu = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    node = TpuNode(d, raw, tpu, measure=lambda w, r: Measurement((), 0.0), clock=clock,
                   sleep=clock.sleep, poll_s=15.0, boot_timeout_s=900.0)
    return {"d": d, "raw": raw, "node": node, "clock": clock}


def _script(api: FakeTpuApi, d: Any) -> str:
    return api.nodes[d.node_path].spec["metadata"]["startup-script"]


def _watcher(api: FakeTpuApi, d: Any, *, word: str = "applied", cache: str = "hit",
             then: Any = None) -> None:
    """What the node's watcher writes once the patched script's boot ends."""
    def boot() -> None:
        sha = hashlib.sha256(_script(api, d).encode()).hexdigest()
        for key, value in PHASES.items():
            api.set_guest_attribute(d.node_name, key, value.format(cache=cache))
        tail = "" if word == "applied" else \
            " not ready after 4 attempts: RuntimeProgramAllocationFailure"
        api.set_guest_attribute(d.node_name, "reconverge",
                                f"2030-01-01T10:12:47Z {word} sha256={sha}{tail}")
        if word == "failed":
            api.set_guest_attribute(d.node_name, "state", "2030-01-01T10:11:31Z failed oom")
        if then is not None:
            then()
    api.on_next_patch_applied(boot)


def test_apply_patches_the_rendered_script_and_reads_the_boot(api: FakeTpuApi,
                                                              env: dict[str, Any]) -> None:
    d, node = env["d"], env["node"]
    terraform = _script(api, d)
    node.check_deployed()  # the node runs what the config renders
    _watcher(api, d, cache="miss")
    rec = node.apply({"max_num_batched_tokens": 8192, "env": {"NUM_PRECOMPILE_WORKERS": 4}})
    assert rec.ok and rec.boot_s == 766 and rec.compile_s == 665 and rec.cache_hit is False
    script = _script(api, d)
    assert "--max-num-batched-tokens 8192" in script and "NUM_PRECOMPILE_WORKERS=4" in script
    [patch] = api.calls("PATCH")
    assert patch.query["updateMask"] == "metadata"
    assert patch.body["metadata"]["enable-oslogin"] == "TRUE"  # the rest of the map kept
    with pytest.raises(OpsError, match="npx cdktf deploy spot"):
        node.check_deployed()
    _watcher(api, d)
    assert node.restore().cache_hit is True
    assert _script(api, d) == terraform


def test_a_failed_word_is_a_failed_boot(api: FakeTpuApi, env: dict[str, Any]) -> None:
    _watcher(api, env["d"], word="failed")
    rec = env["node"].apply({"gpu_memory_utilization": 0.93,
                             "allow_untested_gpu_memory_utilization": True})
    assert not rec.ok and "RuntimeProgramAllocationFailure" in (rec.error or "")


def test_a_word_for_another_script_is_not_taken(api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    api.set_guest_attribute(d.node_name, "reconverge",
                            "2030-01-01T10:00:00Z applied sha256=" + "0" * 64)
    rec = env["node"].apply({"max_num_batched_tokens": 8192})
    assert not rec.ok and "no applied or failed word" in (rec.error or "")
    assert env["clock"].now >= 900


def test_a_node_that_went_away(api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    api.on_next_patch_applied(lambda: api.set_node_state(d.node_name, "PREEMPTED"))
    with pytest.raises(NodeGone, match="PREEMPTED"):
        env["node"].apply({"max_num_batched_tokens": 8192})
    assert json.dumps(api.node_json(d.node_name))  # still readable, just not serving


def test_restore_of_the_script_already_there_reads_the_nodes_own_boot(
        api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    for key, value in PHASES.items():  # booted at creation; the watcher only watches
        api.set_guest_attribute(d.node_name, key, value.format(cache="hit"))
    api.set_guest_attribute(d.node_name, "reconverge", "2030-01-01T10:12:50Z watching etag=1")
    rec = env["node"].restore()
    assert rec.ok and rec.cache_hit is True and not api.calls("PATCH")
    api.set_guest_attribute(d.node_name, "state", "2030-01-01T10:12:46Z booting")
    rec = env["node"].restore()  # still booting: waits, then gives up at the deadline
    assert not rec.ok and env["clock"].now >= 900


# -- a benchmark or boot that fails: whose failure it was, judged by the TPU API (fail closed)
def _failing_bench(env: dict[str, Any], before: Any = None) -> None:
    def measure(w: Any, r: int) -> Measurement:
        if before is not None:
            before()
        raise CandidateFailed("12 request(s) failed in the benchmark; 0 cell(s) measured")
    env["node"]._measure = measure


@pytest.mark.parametrize("end", ["removed", "PREEMPTED", "DELETING"])
def test_a_benchmark_failing_as_the_node_goes_is_node_gone(
        api: FakeTpuApi, env: dict[str, Any], end: str) -> None:
    """A flex run's end (the node removed: NOT_FOUND) or a gone state is proof: NodeGone, not
    the candidate's failure."""
    d = env["d"]
    gone = (lambda: api.nodes.pop(d.node_path)) if end == "removed" else \
        (lambda: api.set_node_state(d.node_name, end))
    _failing_bench(env, gone)
    with pytest.raises(NodeGone, match="NOT_FOUND" if end == "removed" else end):
        env["node"].measure(WORKLOAD, 1)


def test_a_benchmark_failing_on_a_ready_node_is_the_candidates(
        api: FakeTpuApi, env: dict[str, Any]) -> None:
    _failing_bench(env)
    with pytest.raises(CandidateFailed, match="12 request"):
        env["node"].measure(WORKLOAD, 1)


@pytest.mark.parametrize("answer", ["503", "html", "another node", "REPAIRING"])
def test_an_unproven_answer_is_neither_a_failure_nor_the_nodes_end(
        api: FakeTpuApi, env: dict[str, Any], answer: str) -> None:
    """5xx past the retries, an HTML page, another node's answer, a node changing: they prove
    nothing, so the candidate is not recorded failed (it would become a learned refusal) and
    the node is not taken as gone (it may be live, on a half-tried config)."""
    d = env["d"]

    def unproven() -> None:
        if answer == "503":
            api.fail_next(503, "UNAVAILABLE", "backend error", method="GET",
                          path_contains="/nodes/", times=100)
        elif answer == "html":
            api.html_next(502, method="GET", path_contains="/nodes/", times=100)
        elif answer == "another node":
            other = dict(api.node_json(d.node_name), name=d.node_path + "-other")
            api.answer_next(200, json.dumps(other), method="GET", path_contains="/nodes/")
        else:
            api.set_node_state(d.node_name, answer)
    _failing_bench(env, unproven)
    with pytest.raises(NodeUnproven, match="not recorded as the candidate's failure") as info:
        env["node"].measure(WORKLOAD, 1)
    assert not isinstance(info.value, (CandidateFailed, NodeGone))
    assert "run the same command again to resume" in info.value.line


def test_a_failed_boot_as_the_node_goes_is_node_gone(api: FakeTpuApi,
                                                     env: dict[str, Any]) -> None:
    d = env["d"]
    _watcher(api, d, word="failed", then=lambda: api.nodes.pop(d.node_path))
    with pytest.raises(NodeGone, match="does not exist"):
        env["node"].apply({"max_num_batched_tokens": 8192})


def test_a_patch_refused_by_a_node_being_deleted_is_node_gone(
        api: FakeTpuApi, env: dict[str, Any]) -> None:
    api.set_node_state(env["d"].node_name, "DELETING")  # nodes.patch: 400 FAILED_PRECONDITION
    with pytest.raises(NodeGone, match="DELETING"):
        env["node"].apply({"max_num_batched_tokens": 8192})


def test_the_node_going_mid_benchmark_keeps_the_candidate_for_the_next_node(
        api: FakeTpuApi, env: dict[str, Any], tmp_path: Path) -> None:
    """The tuner ends NODE_GONE with the candidate neither recorded nor dropped: on the next
    node (re-created with Terraform's script) the resume runs it once, at the same rung."""
    d, raw = env["d"], env["raw"]
    cands = space(d, raw).candidates[1:2]  # [0] is the deployed config: no patch
    cid = cands[0].id
    st = TuneState("spot", "fp", at_rung=[cid], pending=[cid])
    path = tmp_path / "state.json"

    def tuner(node: TpuNode) -> Tuner:
        return Tuner(node, {c.id: c for c in cands}, st, save=lambda s: save(s, path),
                     usd_per_hour=d.usd_per_hour, limits=Constraints(), workload=WORKLOAD)

    _watcher(api, d)
    _failing_bench(env, lambda: api.nodes.pop(d.node_path))
    out = tuner(env["node"]).run()
    assert out.status == NODE_GONE and "state is saved" in out.message
    saved = load(path)
    assert saved is not None and saved.pending == [cid] and cid not in saved.runs
    assert saved.settled and saved.node_on == TERRAFORM
    # The next node: Terraform's script, booted; the watcher watching.
    _seed(api, d)
    for key, value in PHASES.items():
        api.set_guest_attribute(d.node_name, key, value.format(cache="hit"))
    api.set_guest_attribute(d.node_name, "reconverge", "2030-01-01T10:12:50Z watching etag=1")
    _watcher(api, d)  # the candidate's boot, warm: its programs were published
    _watcher(api, d)  # Terraform's script at the end
    env["node"]._measure = lambda w, r: Measurement((_cell(),), 5.0)
    out = tuner(env["node"]).run()
    assert out.status == DONE and out.best == cid
    assert [(run.rung, run.error) for run in st.runs[cid]] == [(0, None)]
    assert st.runs[cid][0].boot.cache_hit is True


def test_once_the_boot_is_healthy_the_word_is_looked_for_every_second(
        api: FakeTpuApi, env: dict[str, Any]) -> None:
    """Between `health` and the watcher's word only the script's tail runs: polled every
    second (a fifteenth of the 15 s interval), the node's state still once an interval."""
    d, clock = env["d"], env["clock"]

    def healthy() -> None:  # the watcher runs the script: healthy, its tail still running
        sha = hashlib.sha256(_script(api, d).encode()).hexdigest()
        api.set_guest_attribute(d.node_name, "reconverge",
                                f"2030-01-01T09:59:59Z changed sha256={sha} etag=2")
        for key, value in PHASES.items():
            api.set_guest_attribute(d.node_name, key, value.format(cache="miss"))
        api.after_next(lambda: api.set_guest_attribute(
            d.node_name, "reconverge", f"2030-01-01T10:12:50Z applied sha256={sha}"),
            method="POST", path_contains=":getGuestAttributes", skip=5)
    api.on_next_patch_applied(healthy)
    rec = env["node"].apply({"max_num_batched_tokens": 8192})
    assert rec.ok and rec.cache_hit is False
    polls = clock.slept[1:]  # [0]: the nodes.patch operation's 5 s
    assert polls and set(polls) == {1.0}  # never a 15 s wait after health
    reads = api.calls("POST", ":getGuestAttributes")
    gets = [c for c in api.calls("GET", f"/nodes/{d.node_name}") if "operations" not in c.path]
    assert len(reads) == 7 and len(gets) <= 2  # the metadata read, then one state check
