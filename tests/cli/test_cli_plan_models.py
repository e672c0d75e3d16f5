"""`tpuserve plan` for a model other than the default: its own figures, each source stated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from tpuserve.cli import plan as plan_cli

# Shaped like meta-llama/Llama-3.2-3B-Instruct's published geometry (28 layers, 24/8 heads).
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 28,
         "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 3072, "intermediate_size": 8192, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": True}
INDEX = {"metadata": {"total_size": 6_425_499_648}, "weight_map": {"lm": "model-1.safetensors"}}


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def invoke(*args: str) -> Result:
    app = typer.Typer()
    plan_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)
    return CliRunner().invoke(app, ["plan", *args])


def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str) -> None:
    (tmp_path / "l.json").write_text(json.dumps(LLAMA))
    (tmp_path / "i.json").write_text(json.dumps(INDEX))
    (tmp_path / "user.toml").write_text(toml)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))


LLAMA_TOML = ('[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n'
              '[capacity]\nmodel_geometry = "l.json"\nweights_index = "i.json"\n')


def test_default_plan_json_gains_only_sources_all_measured() -> None:
    result = invoke("--json", "--stack", "spot")
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["kv_bytes_per_token"] == 18_432  # SPEC 5
    assert all(v.startswith("measured") for v in data["sources"].values()), data["sources"]


def test_another_model_plans_from_its_own_figures(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    user(tmp_path, monkeypatch, LLAMA_TOML)
    result = invoke("--json", "--stack", "spot")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["weights_bytes"] == 6_425_499_648
    assert data["kv_bytes_per_token"] == 28 * 2 * 8 * 128 * 2
    assert data["measured_tpot_ms"] is None
    s = data["sources"]
    assert s["weights_bytes"].startswith("derived from capacity.weights_index")
    assert s["kv_bytes_per_token"].startswith("derived")
    assert s["profile"].startswith("none: no profile")


def test_the_table_labels_derived_figures(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    user(tmp_path, monkeypatch, LLAMA_TOML)
    out = invoke("--stack", "spot").stdout
    assert "weights (derived: index total_size)" in out and "weights (measured)" not in out
    assert "kv_bytes_per_token: derived" in out
    assert "profile: none: no profile" in out


def test_the_model_alone_is_refused_in_one_line_each(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user.toml").write_text('[vllm]\nmodel = "Qwen/Qwen3-4B"\n')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    result = invoke("--stack", "spot")
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("tpuserve: error: [spot]") for line in lines)
    assert "capacity.model_geometry" in lines[0] and "capacity.weights_index" in lines[1]
