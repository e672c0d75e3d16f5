"""After `tpuserve tune --keep-best`, status says the node runs the tuner's config, not
Terraform's script, naming the tune state file and the overlay, until the overlay is merged
(the config then renders the node's hash) or the node is redeployed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import BOOT_READY, Env, invoke
from tpuserve.ops.served_config import deployed_sha256
from tpuserve.tune import state as state_file
from tpuserve.tune.session import state_path
from tpuserve.tune.state import TuneState

KEPT = "1111222233334444"
CANDIDATE = "b8192 s- l32768 g0 w4 m0.92"


def _kept(stack: str, sha: str = KEPT) -> Path:
    path = state_path(stack)  # beside TPUSERVE_CONFIG's file, as tune writes it
    st = TuneState(stack, "fp", node_on=CANDIDATE, last_good=CANDIDATE, done=True,
                   node_on_sha256=sha, overlay="/work/out/tune-spot-overlay.toml")
    state_file.save(st, path)
    return path


def _seed(cli_env: Env, sha: str) -> None:
    cli_env.seed_ready("spot", attrs={
        **BOOT_READY, "config": f"2030-01-01T10:01:05.000Z argv_sha256={sha}"})


def test_status_reports_the_kept_config_as_drift(cli_env: Env) -> None:
    path = _kept("spot")
    _seed(cli_env, KEPT)
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert s["tune_drift"] == {
        "candidate": CANDIDATE, "state_file": str(path),
        "overlay": "/work/out/tune-spot-overlay.toml", "running_sha256": KEPT,
        "deployed_sha256": deployed_sha256(cli_env.d("spot"))}
    assert s["config"]["state"] == "stale"  # the served-config row agrees
    text = " ".join(invoke("status", "spot").stdout.split())
    assert "drift: the node runs `tpuserve tune --keep-best`'s config" in text
    assert str(path) in text and "tune-spot-overlay.toml" in text
    assert "npx cdktf deploy spot" in text


def test_no_drift_once_the_overlay_is_merged_or_the_node_redeployed(cli_env: Env) -> None:
    merged = deployed_sha256(cli_env.d("spot"))
    _kept("spot", merged)  # the config now renders the node's hash
    _seed(cli_env, merged)
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert "tune_drift" not in s
    _kept("spot")  # the node was redeployed from Terraform's script since
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert "tune_drift" not in s


def test_no_state_file_no_drift(cli_env: Env) -> None:
    _seed(cli_env, KEPT)
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert "tune_drift" not in s and "drift:" not in invoke("status", "spot").stdout
