"""`tpuserve plan`: the planner for one stack as tables, JSON or a PNG; overrides validated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from tpuserve.cli import plan as plan_cli

# The keys `plan --json` promises.
PLAN_KEYS = (
    "kv_bytes_per_token", "hbm_cap_bytes", "weights_bytes", "kv_pool_bytes", "kv_tokens",
    "block_size", "num_blocks", "decode_bytes_per_step", "decode_floor_ms",
)
COST_KEYS = ("usd_per_hour", "usd_per_million_output_tokens", "usd_per_month")


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def invoke(*args: str) -> Result:
    app = typer.Typer()
    plan_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)  # two commands: `plan` stays a subcommand
    return CliRunner().invoke(app, ["plan", *args])


def plan_json(*args: str) -> dict[str, Any]:
    result = invoke("--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def default_plan() -> dict[str, Any]:
    return plan_json()


def test_json_has_every_promised_key(default_plan: dict[str, Any]) -> None:
    p = default_plan
    assert p["stack"] == "flex" and p["provisioning_model"] == "flex"
    for key in PLAN_KEYS:
        assert isinstance(p[key], int | float), key
    for model in ("spot", "flex", "ondemand"):
        assert set(COST_KEYS) <= set(p["provisioning"][model]), model
    # SPEC 5-7 at the default flex deployment (0.92, max-model-len 32768).
    assert p["kv_bytes_per_token"] == 18_432
    assert p["block_size"] == 64
    assert p["decode_floor_ms"] == pytest.approx(3.94, abs=0.005)
    assert p["provisioning"]["flex"]["usd_per_million_output_tokens"]["128x64"] == (
        pytest.approx(0.111, abs=0.0005))
    assert p["provisioning"]["flex"]["usd_per_month"] == pytest.approx(438)


def test_overrides_change_the_figures(default_plan: dict[str, Any]) -> None:
    half = plan_json("--max-model-len", "16384")
    assert (half["block_size"], default_plan["block_size"]) == (32, 64)  # SPEC 4
    assert half["num_blocks"] == 2 * default_plan["num_blocks"]
    # The pool given in bytes reproduces the engine exactly (SPEC 4/5).
    exact = plan_json("--kv-cache-memory-bytes", "5923602432")
    assert (exact["num_blocks"], exact["kv_block_tokens"]) == (5_021, 321_344)
    lower = plan_json("--gpu-memory-utilization", "0.9")
    assert lower["hbm_cap_bytes"] < default_plan["hbm_cap_bytes"]
    assert lower["kv_tokens"] < default_plan["kv_tokens"]
    assert plan_json("--stack", "spot")["provisioning_model"] == "spot"


def test_another_model_config_and_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"text_config": {
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 64, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 1000,
    }}))
    # Under the default model this geometry is not Gemma 4 E2B's shipped one: refused.
    refused = invoke("--model-config", str(cfg), "--weights-gib", "1")
    assert refused.exit_code == 2 and "num_hidden_layers = 4" in refused.stderr
    (tmp_path / "user.toml").write_text('[vllm]\nmodel = "acme/tiny-4-layer"\n')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    p = plan_json("--model-config", str(cfg), "--weights-gib", "1")
    assert p["kv_bytes_per_token"] == 4 * 2 * 2 * 64 * 2  # layers x heads x (K,V) x dim x bf16
    assert p["model"]["num_hidden_layers"] == 4
    assert p["weights_bytes"] == 2**30


def test_throughput_table_from_a_bench_json(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"cells": [
        {"context": 128, "clients": 64, "output_tokens_per_s": 3000.0, "ttft_ms": 12.0}]}))
    p = plan_json("--throughput", str(bench))
    assert p["provisioning"]["flex"]["usd_per_million_output_tokens"] == {
        "128x64": pytest.approx(0.6 / (3000 * 3600) * 1e6)}
    bench.write_text('{"cells": [{"context": 128}]}')
    result = invoke("--throughput", str(bench))
    assert result.exit_code == 2
    assert_one_line(result, "--throughput")


def test_png_is_written(tmp_path: Path) -> None:
    out = tmp_path / "plan.png"
    result = invoke("--png", str(out))
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "HBM budget" in result.stdout and "$ per million output tokens" in result.stdout


def assert_one_line(result: Result, *needles: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_a_bad_override_is_one_line_naming_the_rule() -> None:
    result = invoke("--gpu-memory-utilization", "0.95")
    assert result.exit_code == 2 and result.stdout == ""
    assert_one_line(result, "vllm.gpu_memory_utilization = 0.95", "691 s")


def test_each_problem_gets_its_own_line() -> None:
    result = invoke("--max-model-len", "524288", "--tensor-parallel-size", "3")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tensor_parallel_size = 3" in lines[0]  # pydantic stops here
    result = invoke("--max-model-len", "524288")
    assert_one_line(result, "vllm.max_model_len = 524288", "pool holds")


def test_tensor_parallel_beyond_the_chips_and_an_unknown_stack() -> None:
    assert_one_line(invoke("--tensor-parallel-size", "2"), "must be <= the 1 chip(s)")
    result = invoke("--stack", "nope")
    assert result.exit_code == 2
    assert_one_line(result, "--stack 'nope'", "spot, ondemand, flex")


def test_a_missing_model_config_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("--model-config", str(tmp_path / "absent.json"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize(("toml", "needle"), [
    ('stacks = "spot"', "stacks = 'spot': must be a table"),
    ("[stacks]\nspot = 5", "stacks.spot = 5: must be a table"),
])
def test_a_malformed_stacks_table_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              toml: str, needle: str) -> None:
    (tmp_path / "user.toml").write_text(toml)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    result = invoke("--stack", "spot")
    assert result.exit_code == 2
    assert_one_line(result, needle)


FLEET_TOML = """
[stacks.fleet]
provisioning_model = "fleet"
[stacks.fleet.vllm]
image = "vllm/vllm-tpu:nightly@sha256:""" + "ab" * 32 + """"
"""


@pytest.fixture()
def fleet_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET_TOML)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(path))


@pytest.mark.usefixtures("fleet_config")
def test_fleet_json_adds_a_fleet_key_and_keeps_the_rest(default_plan: dict[str, Any]) -> None:
    p = plan_json("--stack", "fleet")
    assert p["stack"] == "fleet" and p["provisioning_model"] == "fleet"
    assert set(default_plan) | {"fleet"} == set(p)
    f = p["fleet"]
    assert f["replicas"] == {"min": 1, "max": 4}
    assert f["cost"]["min"]["first_choice"]["pool"] == f["provisioning"][0]
    assert f["cost"]["max"]["first_choice"]["usd_per_month"] > (
        f["cost"]["min"]["first_choice"]["usd_per_month"])
    assert "choose the fleet when" in f["choose_fleet_when"]


@pytest.mark.usefixtures("fleet_config")
def test_fleet_text_prints_the_fleet_tables() -> None:
    result = invoke("--stack", "fleet")
    assert result.exit_code == 0, result.stderr
    assert "Fleet cost" in result.stdout and "Choose the fleet when" in result.stdout


def test_other_stacks_have_no_fleet_key(default_plan: dict[str, Any]) -> None:
    assert "fleet" not in default_plan
    assert "Fleet cost" not in invoke("--stack", "flex").stdout


def test_a_stack_switched_off_is_not_in_the_configuration(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "user.toml"
    user.write_text("[stacks.flex]\nenabled = false\n")
    monkeypatch.setenv("TPUSERVE_CONFIG", str(user))
    result = invoke("--stack", "flex")
    assert result.exit_code != 0
    assert "--stack 'flex': not in the configuration (configured: spot, ondemand, fleet)" in (
        result.stderr)
    assert invoke("--json", "--stack", "spot").exit_code == 0
