"""The simulator behind the real boot: tests/render/boot's fakes (metadata, guest attributes,
Secret Manager, Storage, TPU API), the rendered boot script run by bash, the fake docker
running tests/sim/vllm_sim.py as the vLLM container with the flags the script rendered, the
API-key proxy in front, and the project's own `tpuserve bench` measuring it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tests.render.boot.support import NAMESPACE, Cloud, wait_for
from tests.sim import response_model as rm
from tests.sim.link import NodeLink
from tests.sim.support import (
    REAL_PROXY,
    bench_cell,
    candidate,
    config_of,
    sim_node,
    smoke,
    vllm_log,
    write_seed,
)
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import Deployment

# The bench's figures against the model's: the server paces every request by the model
# exactly, each x a 1%-cv factor; the client's and the proxy's own time (a few ms per
# request on this shared machine) is what the allowance covers.
REL = 0.12
TTFT_SLACK_MS = 15.0


def _tuned(d: Deployment) -> Deployment:
    return candidate(d, max_num_batched_tokens=8192, max_model_len=65536,
                     env={"VLLM_TPU_BUCKET_PADDING_GAP": 128, "NUM_PRECOMPILE_WORKERS": 4})


@REAL_PROXY
@pytest.mark.parametrize(("label", "seed", "context", "clients", "serve_scale", "rounds"), [
    ("default", 1, 128, 4, 1.0, 2),
    ("tuned", 1, 1024, 8, 1.0, 2),
    # Past the KV wall (64 x 8,208 tokens against 321,344): 11.7 s TTFTs, served 10x faster.
    ("wall", 2, 8192, 64, 0.1, 1),
])
def test_the_booted_simulator_answers_the_projects_bench_as_the_model_predicts(
        cloud: Cloud, tmp_path: Path, label: str, seed: int, context: int, clients: int,
        serve_scale: float, rounds: int) -> None:
    d = _tuned(cloud.deployment) if label == "tuned" else cloud.deployment
    seed_file = write_seed(tmp_path / "seed.json", seed, serve_scale=serve_scale)
    node = sim_node(cloud, seed_file, d)
    node.run(timeout=120)
    assert node.attrs()["health"] == "ok"
    # The seed reaches the fake docker only: not the container, not the script or metadata.
    assert not [e for e in node.container("vllm-gemma4")["env"] if "FAKE_" in e]
    assert str(seed_file) not in node.script.read_text()
    output = 16 if label == "wall" else 32
    cell = bench_cell(cloud, node, tmp_path / "out", context=context, clients=clients,
                      output_tokens=output, repetitions=rounds, requests_per_client=rounds)
    cfg = config_of(d)
    want = rm.cell(cfg, rm.Params.draw(seed), cell.prompt_tokens, clients, cell.output_tokens)
    got = cell.doc
    assert got["errors"] == 0 and got["requests"] == rounds * clients * rounds
    assert got["output_tokens_per_s"] * serve_scale == pytest.approx(want.tok_s, rel=REL)
    assert got["tpot_ms_median"] / serve_scale == pytest.approx(want.tpot_ms, rel=REL)
    assert got["ttft_ms_median"] / serve_scale == pytest.approx(
        want.ttft_ms, rel=REL, abs=TTFT_SLACK_MS / serve_scale)
    if label == "wall":
        assert want.overload > 1 and want.ttft_ms > 10_000
    if label == "tuned":  # the flags were read: 65536 -> block 128, the gap's 35-bucket ladder
        log = vllm_log(node)
        assert f"num_blocks={rm.kv_blocks(cfg)} | block_size=128" in log
        assert f"Compiling {int(rm.programs(cfg))} XLA programs" in log
        assert int(rm.programs(cfg)) == 67 * 6  # 16..128, then steps of 128 to 8192
        # ... and NUM_PRECOMPILE_WORKERS=4 (-e on the container) set the compile time.
        assert cfg.precompile_workers == 4
        compiled = rm.compile_s(cfg, rm.Params.draw(seed))
        assert compiled != rm.compile_s(dataclasses.replace(cfg, precompile_workers=1),
                                        rm.Params.draw(seed))
        assert f"Compilation finished in {compiled:.1f} s (simulated)" in log


def test_a_candidate_compiling_past_the_readiness_budget_fails_the_boot(
        cloud: Cloud, tmp_path: Path) -> None:
    """Seed 4 compiles the gap's 67-bucket ladder slowly (2 workers at most help): the model
    says 2,860 s, past the script's 2400 s readiness budget, on the same time scale."""
    d = _tuned(cloud.deployment)
    assert (rm.boot(config_of(d), rm.Params.draw(4), warm=False).ready_s or 0) > 2400
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 4), d)
    node.run(expect_rc=1, timeout=120)
    assert node.attrs()["state"].startswith("failed vLLM not healthy after 2400 s")


def test_095_dies_in_the_boot_with_spec4s_error(cloud: Cloud, tmp_path: Path) -> None:
    d = candidate(cloud.deployment, gpu_memory_utilization=0.95,
                  allow_untested_gpu_memory_utilization=True)
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 0), d)
    node.run(expect_rc=1, timeout=120)
    attrs = node.attrs()
    assert attrs["state"].startswith(
        "failed vLLM exited: ERROR [core.py] RuntimeProgramAllocationFailure: Attempting to "
        "reserve 384.11M")
    # SPEC 4: the KV pool sized as the arithmetic said (cap 14.96 GiB) before it died.
    assert "total_hbm_limit_cap_gb=14.96GiB" in attrs["memory"]
    assert attrs["kv_cache"] == "seen" and "health" not in attrs
    assert "Loading jit_structured_decode_fn" in vllm_log(node)


def test_below_the_multimodal_floor_the_boot_fails_with_vllms_line(
        cloud: Cloud, tmp_path: Path) -> None:
    d = candidate(cloud.deployment, max_num_batched_tokens=2048)
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 0), d)
    node.run(expect_rc=1, timeout=120)
    assert "max_tokens_per_mm_item (2496) is larger than max_num_batched_tokens (2048)" in (
        node.attrs()["state"])


def test_a_new_node_restores_the_published_cache_and_boots_warm(
        cloud: Cloud, tmp_path: Path) -> None:
    seed = write_seed(tmp_path / "seed.json", 2)
    first = sim_node(cloud, seed)
    first.run(timeout=120)
    assert first.attrs()["cache_publish"].startswith("published")
    assert "(no compile cache entries)" in vllm_log(first)
    first.stop()
    second = sim_node(cloud, seed)  # a preemption's replacement: an empty disk
    second.run(timeout=120)
    assert second.attrs()["cache"].startswith("hit ")
    log = vllm_log(second)
    assert f"Loading {int(rm.programs(config_of(cloud.deployment)))} compiled programs" in log
    assert "Compiling" not in log


def test_a_candidate_patched_into_metadata_is_booted_by_the_watcher(
        cloud: Cloud, tmp_path: Path) -> None:
    """What the tuner will do: the watcher runs a changed startup-script in place, and the
    simulator comes up with the candidate's flags."""
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 1))
    cloud.metadata.set_attribute("startup-script", node.script.read_text())
    node.run(timeout=120)
    wait_for(lambda: _reconverge(cloud), "the watcher's first record", timeout=60)
    new = _tuned(node.deployment)
    since = time.time()
    cloud.metadata.set_attribute("startup-script",
                                 render_startup(new, backend_port=cloud.backend_port))
    wait_for(lambda: any(v.startswith(("applied", "failed")) for v in _reconverge(cloud, since)),
             "the candidate's boot", timeout=90)
    assert [v.split(" ")[0] for v in _reconverge(cloud, since)] == ["changed", "applied"]
    assert "block_size=128" in vllm_log(node)
    assert node.attrs()["health"] == "ok"


def _reconverge(cloud: Cloud, since: float = 0) -> list[str]:
    return [w.value.split(" ", 1)[1] for w in cloud.metadata.writes_in(NAMESPACE)
            if w.key == "reconverge" and w.at >= since]


@REAL_PROXY
def test_the_booted_simulator_passes_the_projects_smoke(cloud: Cloud, tmp_path: Path) -> None:
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 2))
    node.run(timeout=120)
    doc = smoke(cloud, node)
    assert doc["ok"] is True
    assert {c["check"]: c["result"] for c in doc["checks"]} == dict.fromkeys(
        ["health", "models", "chat completion", "tool call", "image input", "long prompt",
         "no key on /v1 refused", "no key on /metrics refused",
         "no key: encoded variants refused"], "pass")


def test_a_candidate_that_dies_then_the_last_good_script_boots_warm_again(
        cloud: Cloud, tmp_path: Path) -> None:
    """The tuner's safety path, on the boot it relies on: 0.95 patched in dies as SPEC 4 says
    and the watcher records the failure; the last good script patched back boots again, warm
    (its compile cache was published to the bucket by the first boot)."""
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 0))
    good = node.script.read_text()
    cloud.metadata.set_attribute("startup-script", good)
    node.run(timeout=120)
    assert node.attrs()["cache_publish"].startswith("published")
    wait_for(lambda: _reconverge(cloud), "the watcher's first record", timeout=60)
    bad = candidate(node.deployment, gpu_memory_utilization=0.95,
                    allow_untested_gpu_memory_utilization=True)
    since = time.time()
    cloud.metadata.set_attribute("startup-script",
                                 render_startup(bad, backend_port=cloud.backend_port))
    wait_for(lambda: any(v.startswith(("applied", "failed")) for v in _reconverge(cloud, since)),
             "the candidate's boot", timeout=90)
    assert _reconverge(cloud, since)[-1].startswith("failed")
    assert "RuntimeProgramAllocationFailure" in node.attrs()["state"]
    since = time.time()
    cloud.metadata.set_attribute("startup-script", good)
    wait_for(lambda: any(v.startswith(("applied", "failed")) for v in _reconverge(cloud, since)),
             "the last good script's boot", timeout=90)
    assert _reconverge(cloud, since)[-1].startswith("applied")
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["health"] == "ok"
    assert "compiled programs from the cache" in vllm_log(node)


def test_a_candidate_patched_through_the_tpu_api_boots_and_its_phases_read_back(
        cloud: Cloud, tmp_path: Path) -> None:
    """The tuner's path end to end on the fakes: the product's own TPU client patches the
    node's metadata (nodes.patch), the node's watcher boots the simulator with the new flags,
    and the same client reads the boot's phases back as guest attributes."""
    node = sim_node(cloud, write_seed(tmp_path / "seed.json", 1))
    with NodeLink(cloud, node) as link:
        node.run(timeout=120)
        wait_for(lambda: _reconverge(cloud), "the watcher's first record", timeout=60)
        client = TpuClient(environ=cloud.tpu.environ())
        meta = client.node_metadata(link.name)
        assert meta is not None and meta["startup-script"] == node.script.read_text()
        new = _tuned(node.deployment)
        since = time.time()
        client.update_node_metadata(link.name, {
            **meta, "startup-script": render_startup(new, backend_port=cloud.backend_port)})
        wait_for(lambda: any(v.startswith(("applied", "failed"))
                             for v in _reconverge(cloud, since)),
                 "the candidate's boot", timeout=90)
        link.sync()
        attrs = client.guest_attributes(node.deployment, NAMESPACE)
    assert attrs["reconverge"].split(" ")[1] == "applied"
    assert attrs["health"].endswith(" ok") and attrs["state"].endswith(" ready")
    assert "block_size=128" in vllm_log(node)
