"""SPEC 5's TPOT and SPEC 4's boot times are the measured pair's (Gemma 4 E2B on v5litepod-1):
`plan` prints them as measured there only, and says whose they are anywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_plan_models import LLAMA_TOML, invoke, user
from tpuserve.facts import E2B_MEASURED_TPOT_MS

E2B_V6E = '[tpu]\naccelerator_type = "v6e-1"\n[gcp]\nzone = "us-east5-a"\n'


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def test_the_measured_pair_keeps_its_tpot_and_no_boot_times_source() -> None:
    data = json.loads(invoke("--json", "--stack", "spot").stdout)
    assert data["measured_tpot_ms"] == E2B_MEASURED_TPOT_MS
    assert data["bandwidth_efficiency"] is not None
    assert "boot_times" not in data["sources"]  # the default's plan --json is unchanged


def test_e2b_on_v6e_has_no_measured_tpot_nor_a_bandwidth_share_from_v5e(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "u.toml").write_text(E2B_V6E)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "u.toml"))
    result = invoke("--json", "--stack", "spot")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["measured_tpot_ms"] is None
    assert data["bandwidth_efficiency"] is None
    tpot = data["sources"]["measured_tpot_ms"]
    assert tpot.startswith("none:") and "v5litepod-1, not v6e-1" in tpot
    text = invoke("--stack", "spot").stdout
    rows = [line for line in text.splitlines() if line.startswith("│")]  # the tables' rows
    assert not [r for r in rows if "measured TPOT" in r or "share of peak bandwidth" in r]
    assert any("bandwidth floor" in r for r in rows)
    assert "measured_tpot_ms: none:" in text  # the text plan says why


def test_another_model_labels_e2b_boot_times_in_sources_and_the_rebuild_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user(tmp_path, monkeypatch, '[tpu]\naccelerator_type = "v5litepod-4"\n' + LLAMA_TOML)
    result = invoke("--json", "--stack", "spot")
    assert result.exit_code == 0, result.stderr
    boot = json.loads(result.stdout)["sources"]["boot_times"]
    assert boot.startswith("derived:") and "857 s" in boot and "not this model's" in boot
    text = invoke("--stack", "spot").stdout
    assert "seconds d" in text
    assert "seconds d = derived: Gemma 4 E2B's boots on v5litepod-1" in " ".join(text.split())
    assert "boot_times: derived:" in text
