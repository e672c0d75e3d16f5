"""`tpuserve tune spot` with the real TPU-API node: the fake TPU API takes each nodes.patch,
the test plays the node's watcher (the boot phases and the `applied` word for the patched
script's sha256), and the project's benchmark measures the fake OpenAI-compatible server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.cli_support import PROJECT, ZONE, Env, invoke
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import load

TUNE = """
[tune]
max_num_batched_tokens = [4096, 8192]
max_num_seqs = ["unset"]
max_model_len = [4096]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1]
gpu_memory_utilization = [0.92]
"""
PHASES = {
    "boot": "2030-01-01T10:00:00Z started",
    "cache": "2030-01-01T10:00:02Z hit object_bytes=1 files=2 bytes=3",
    "kv_cache": "2030-01-01T10:01:40Z blocks=5021",
    "startup_complete": "2030-01-01T10:03:40Z seen",
    "health": "2030-01-01T10:03:41Z ok",
    "state": "2030-01-01T10:03:41Z ready",
}


@pytest.mark.parametrize("measured", ["cells", "trace"])
def test_tune_applies_measures_and_restores_through_the_tpu_api(
        cli_env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measured: str) -> None:
    # A watcher word that never comes fails in seconds here, not after an hour.
    monkeypatch.setattr("tpuserve.tune.tpu_node.BOOT_TIMEOUT_S", 20.0)
    monkeypatch.setattr("tpuserve.tune.tpu_node.POLL_S", 0.2)
    cli_env.config_path.write_text(cli_env.config_path.read_text() + TUNE)
    d = load().deployments["spot"]
    api = cli_env.tpu
    api.patch_reads_until_done = 0
    api.seed_node(PROJECT, ZONE, d.node_name, external_ip="127.0.0.1", spec={
        "acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite",
        "networkConfig": {"network": "default", "enableExternalIps": True},
        "metadata": {"startup-script": render_startup(d)}})
    scripts: list[str] = []

    def watcher() -> None:
        script = api.nodes[d.node_path].spec["metadata"]["startup-script"]
        scripts.append(script)
        for key, value in PHASES.items():
            api.set_guest_attribute(d.node_name, key, value)
        sha = hashlib.sha256(script.encode()).hexdigest()
        api.set_guest_attribute(d.node_name, "reconverge",
                                f"2030-01-01T10:03:42Z applied sha256={sha}")
        api.on_next_patch_applied(watcher)

    # Booted at creation with Terraform's script (the first candidate's); the watcher watches.
    for key, value in PHASES.items():
        api.set_guest_attribute(d.node_name, key, value)
    api.set_guest_attribute(d.node_name, "reconverge", "2030-01-01T10:03:50Z watching etag=1")
    api.on_next_patch_applied(watcher)
    overlay = tmp_path / "overlay.toml"
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_tokens": 50, "output_tokens": 8}\n'
                     '{"prompt_tokens": 90, "output_tokens": 3}\n')
    workload = (["--contexts", "64", "--output-tokens", "8"] if measured == "cells"
                else ["--trace", str(trace)])  # the trace replayed on the node's server
    r = invoke("tune", "spot", "--yes", *workload, "--clients", "1", "--repetitions", "1",
               "--out", str(tmp_path / "out"), "--write", str(overlay))
    assert r.exit_code == 0, r.stderr
    # The first candidate is the deployed config (no patch); the second is patched in, then
    # Terraform's script goes back.
    assert len(scripts) == 2
    assert "--max-num-batched-tokens 8192" in scripts[0]
    assert scripts[-1] == render_startup(d)
    assert "[stacks.spot.vllm]" in overlay.read_text()
    if measured == "trace":
        chats = [q.body for q in cli_env.oai.requests if q.path == "/v1/chat/completions"]
        assert sorted(b["max_tokens"] for b in chats if b) == [3, 3, 8, 8]
