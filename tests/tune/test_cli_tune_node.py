"""`tpuserve tune spot` with the real TPU-API node: the fake TPU API takes each nodes.patch,
the test plays the node's watcher (the boot phases and the `applied` word for the patched
script's sha256), and the project's benchmark measures the fake OpenAI-compatible server."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.cli_support import PROJECT, ZONE, Env, assert_one_line_error, invoke
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import load
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune import session
from tpuserve.tune import state as state_file
from tpuserve.tune.score import Constraints
from tpuserve.tune.workload import Workload

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


# -- the script the end restores is the one the node held when the search started
def _saved_search(cli_env: Env, tmp_path: Path) -> tuple[Path, str]:
    """A search prepared from the config (as `tune spot` starts one) and saved, unstarted."""
    cli_env.config_path.write_text(cli_env.config_path.read_text() + TUNE)
    raw = load_raw()
    d = from_raw(raw).deployments["spot"]
    path = tmp_path / "state.json"
    prep = session.prepare(d, raw, Workload((64,), (1,), 8), Constraints(), 1, path,
                           fresh=False)
    state_file.save(prep.state, path)
    return path, render_startup(d)


def test_a_fresh_search_saves_the_sha256_of_the_script_it_starts_from(
        cli_env: Env, tmp_path: Path) -> None:
    path, script = _saved_search(cli_env, tmp_path)
    saved = state_file.load(path)
    assert saved is not None
    assert saved.terraform_sha256 == hashlib.sha256(script.encode()).hexdigest()
    assert json.loads(path.read_text())["version"] == 2


def test_a_resume_after_a_config_edit_is_refused_in_one_line(cli_env: Env,
                                                              tmp_path: Path) -> None:
    """An edit between the interruption and the resume: the config renders another script
    than the node held, so the end would "restore" a script Terraform never deployed."""
    path, _script = _saved_search(cli_env, tmp_path)
    text = cli_env.config_path.read_text()
    cli_env.config_path.write_text(text.replace("max_model_len = 4096\n",
                                                "max_model_len = 8192\n", 1))
    r = invoke("tune", "spot", "--yes", "--contexts", "64", "--clients", "1",
               "--output-tokens", "8", "--repetitions", "1", "--state", str(path))
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, str(path), "renders another startup-script",
                          "Terraform never deployed", "--fresh")
    assert not cli_env.tpu.calls("PATCH")  # refused before anything was touched


def test_a_state_file_of_the_previous_version_is_read_but_not_resumed(
        cli_env: Env, tmp_path: Path) -> None:
    path, _script = _saved_search(cli_env, tmp_path)
    doc = json.loads(path.read_text())
    del doc["terraform_sha256"]
    path.write_text(json.dumps({**doc, "version": 1}))
    assert state_file.load(path) is not None  # status and review still read its drift
    r = invoke("tune", "spot", "--yes", "--contexts", "64", "--clients", "1",
               "--output-tokens", "8", "--repetitions", "1", "--state", str(path))
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "did not record the startup-script", "--fresh")
    path.write_text(json.dumps({**doc, "terraform_sha256": "not-a-sha"}))
    with pytest.raises(ValueError, match="not a sha256"):
        state_file.load(path)
