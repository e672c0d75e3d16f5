"""The accelerator table and what the settings derive from it: each refusal is one line naming
the setting; the derived TP, runtime and memory ceiling; the doc page's table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tpuserve.accelerators import ACCELERATORS, V5E, V6E, accelerator, multi_host
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.settings.accelerator_rules import memory_ceiling
from tpuserve.settings.loader import ConfigError, load

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "accelerators.md"


def _load(tmp_path: Path, text: str) -> Any:
    user = tmp_path / "user.toml"
    user.write_text(text)
    return load(environ={"TPUSERVE_CONFIG": str(user)})


def _refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, text)
    msg = str(exc.value)
    assert "Traceback" not in msg
    return msg


def test_the_table_holds_the_single_host_slices_and_nothing_else() -> None:
    assert list(ACCELERATORS) == ["v5litepod-1", "v5litepod-4", "v5litepod-8",
                                  "v6e-1", "v6e-4", "v6e-8"]
    assert [a.topology for a in ACCELERATORS.values()] == ["1x1", "2x2", "2x4"] * 2
    assert accelerator("v5litepod-1").machine_type == "ct5lp-hightpu-1t"
    assert accelerator("v6e-8").machine_type == "ct6e-standard-8t"
    assert accelerator("v6e-4").family.gke_accelerator == "tpu-v6e-slice"
    assert V5E.hbm_measured and not V6E.hbm_measured
    assert V6E.hbm_source.startswith("derived") and V6E.hbm_visible_gib == 31.5
    assert multi_host("v5litepod-16") is V5E and multi_host("v6e-256") is V6E
    assert multi_host("v5litepod-8") is None and multi_host("v6e-3") is None


def test_the_memory_ceiling_is_measured_on_v5e_1_and_derived_elsewhere() -> None:
    assert memory_ceiling(accelerator("v5litepod-1")).value == 0.92
    assert memory_ceiling(accelerator("v5litepod-1")).measured
    # 1 - (1.26 GiB + 384.11 MiB) / 15.75 GiB = 0.896: below the measured 0.92.
    four = memory_ceiling(accelerator("v5litepod-4"))
    assert (four.value, four.measured) == (0.89, False) and four.source.startswith("derived")
    # 1 - 1.635 / 31.5 = 0.948, never above the measured 0.92.
    assert memory_ceiling(accelerator("v6e-1")).value == 0.92


@pytest.mark.parametrize(("config", "needle"), [
    ('[tpu]\naccelerator_type = "v5litepod-16"\n',
     "tpu.accelerator_type = 'v5litepod-16': a multi-host slice"),
    ('[tpu]\naccelerator_type = "v6e-32"\n', "tpu.accelerator_type = 'v6e-32': a multi-host"),
    ('[tpu]\naccelerator_type = "v7x-1"\n',
     "tpu.accelerator_type = 'v7x-1': not a single-host v5e or v6e slice"),
    ('[tpu]\naccelerator_type = "v6e-1"\nruntime_version = "v2-alpha-tpuv5-lite"\n',
     "tpu.runtime_version = 'v2-alpha-tpuv5-lite': the v5e runtime cannot boot v6e-1"),
    ('[tpu]\naccelerator_type = "v5litepod-4"\n[vllm]\ntensor_parallel_size = 1\n',
     "vllm.tensor_parallel_size = 1: below the 4 chips of v5litepod-4: 3 would idle"),
    ('[tpu]\naccelerator_type = "v5litepod-4"\n[vllm]\ntensor_parallel_size = 8\n',
     "vllm.tensor_parallel_size = 8: must be <= the 4 chip(s) of v5litepod-4"),
    ('[tpu]\naccelerator_type = "v5litepod-4"\n[vllm]\ngpu_memory_utilization = 0.92\n',
     "vllm.gpu_memory_utilization = 0.92: above the ceiling 0.89 of v5litepod-4"),
])
def test_each_refusal_is_one_line_naming_the_setting(tmp_path: Path, config: str,
                                                     needle: str) -> None:
    msg = _refusal(tmp_path, config)
    assert needle in msg
    line = next(x for x in msg.splitlines() if needle in x)
    assert "(" in line.split(needle, 1)[1]  # the rule's source follows, on the same line


def test_tp_below_the_chips_suggests_replicas_on_the_fleet(tmp_path: Path) -> None:
    msg = _refusal(tmp_path, '[tpu]\naccelerator_type = "v6e-8"\n[vllm]\n'
                             'tensor_parallel_size = 1\n')
    assert "replicas on the fleet with tpu.accelerator_type = 'v6e-1'" in msg


def test_a_tp_that_does_not_divide_the_heads_is_refused(tmp_path: Path) -> None:
    config = json.loads((DEFAULT_CONFIG.parent / "models" / "gemma-4-E2B-it.json").read_text())
    text = config.get("text_config", config)
    text["num_attention_heads"] = 12  # 12 % 8 != 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    msg = _refusal(tmp_path, '[tpu]\naccelerator_type = "v5litepod-8"\n'
                             '[capacity]\nmodel_geometry = "config.json"\n')
    assert "vllm.tensor_parallel_size = 8: does not divide the model's 12 attention heads" in msg


def test_tp_and_runtime_are_derived_when_unset(tmp_path: Path) -> None:
    d = _load(tmp_path, '[tpu]\naccelerator_type = "v6e-4"\n').deployments["spot"]
    assert d.vllm.tensor_parallel_size == 4 and d.tpu.runtime_version == "v2-alpha-tpuv6e"
    assert d.vllm.gpu_memory_utilization == 0.92
    default = load(environ={}).deployments["spot"]
    assert default.vllm.tensor_parallel_size == 1
    assert default.tpu.runtime_version == "v2-alpha-tpuv5-lite"


def test_the_default_config_sets_neither_runtime_nor_tp() -> None:
    text = DEFAULT_CONFIG.read_text()
    assert not re.search(r"^\s*(runtime_version|tensor_parallel_size)\s*=", text, re.M)


def test_e2b_on_four_chips_warns_of_its_one_kv_head(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n')
    spot = [w for w in loaded.warnings if w.startswith("[spot]")]
    assert any("1 KV head, padded to a multiple of TP, so KV memory is paid 4x" in w
               and "replicas" in w for w in spot)
    assert any("the ceiling on v5litepod-4 is 0.89 (derived:" in w for w in spot)


# Every stack per slice: tests/test_other_models.py synthesizes v5litepod-4 and v6e-1 with
# other models (their own config.json, weights_index / weights_gib) through the default's checks.


# ------------------------------------------------------------------ the doc page


def render_table() -> str:
    """docs/accelerators.md's table, from tpuserve/accelerators.py."""
    rows = [("| accelerator_type | topology | GKE machine type | GKE accelerator | runtime | "
             "HBM visible per chip | HBM bandwidth per chip | peak bf16 per chip |"),
            "|---|---|---|---|---|---|---|---|"]
    for a in ACCELERATORS.values():
        f = a.family
        rows.append(
            f"| `{a.accelerator_type}` | {a.topology} | `{a.machine_type}` | "
            f"`{f.gke_accelerator}` | `{f.runtime_version}` | {f.hbm_visible_gib:g} GiB | "
            f"{f.hbm_bandwidth_bytes_per_s / 2**30:.0f} GiB/s "
            f"({f.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s) | {f.peak_bf16_flops / 1e12:.0f} "
            "TFLOPS |")
    return "\n".join(rows) + "\n"


def test_the_doc_page_lists_the_table_and_each_source() -> None:
    text = DOC.read_text()
    assert render_table() in text, "docs/accelerators.md's table differs from the code's"
    for f in (V5E, V6E):
        for source in (f.runtime_source, f.hbm_source, f.bandwidth_source, f.peak_source):
            assert source in text, source


def test_another_models_kv_replication_is_derived_from_its_geometry(tmp_path: Path) -> None:
    config = json.loads((DEFAULT_CONFIG.parent / "models" / "gemma-4-E2B-it.json").read_text())
    text = config.get("text_config", config)
    text["num_key_value_heads"] = 2
    text.pop("num_global_key_value_heads", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = _load(tmp_path, '[tpu]\naccelerator_type = "v5litepod-8"\n'
                             '[vllm]\nmodel = "example/other-model"\n'
                             '[capacity]\nmodel_geometry = "config.json"\n'
                             'weights_gib = 8.97\n')  # another model names its own weights
    spot = [w for w in loaded.warnings if w.startswith("[spot]")]
    (line,) = [w for w in spot if "vllm.tensor_parallel_size = 8" in w]
    assert "2 KV head(s), padded to 8 for TP 8, so KV memory is paid 4x" in line
    assert "(derived from the geometry's num_key_value_heads" in line
    assert "8 replicas of v5litepod-1 on the fleet serve cheaper" in line
    # The measured model's rule (SPEC 4) is not applied to another model.
    assert not any("the model has 1 KV head" in w for w in spot)


def test_another_chip_is_priced_by_the_book_and_a_price_no_source_names_is_warned(
        tmp_path: Path) -> None:
    # v6e-1 in us-east5: spot and on-demand from the shipped snapshot (per chip), flex from no
    # source: [pricing]'s SPEC 2 figure stands in for it, and synth says so.
    loaded = _load(tmp_path, '[gcp]\nzone = "us-east5-a"\n[tpu]\naccelerator_type = "v6e-1"\n')
    spot = loaded.deployments["spot"]
    assert (spot.usd_per_hour, spot.price.source.split()[0]) == (1.35, "snapshot")
    assert not [w for w in loaded.warnings if w.startswith("[spot] pricing.spot = ")]
    (line,) = [w for w in loaded.warnings if w.startswith("[flex] pricing.flex = 0.6:")]
    assert "no source prices v6e-1 flex in us-east5" in line and "[pricing] flex" in line
    priced = _load(tmp_path, '[gcp]\nzone = "us-east5-a"\n[tpu]\naccelerator_type = "v6e-1"\n'
                             '[pricing]\nspot = 1.2\nflex = 1.3\nondemand = 2.7\n')
    assert not [w for w in priced.warnings if "no source prices" in w]
    assert priced.deployments["flex"].price.source == "pricing setting"
    assert not [w for w in _load(tmp_path, "").warnings if "no source prices" in w]


def test_the_derived_ceiling_message_prints_the_number_it_checks(tmp_path: Path) -> None:
    # v5litepod-4: 1 - 1.635 / 15.75 = 0.8961...; 0.895 is refused against 0.89, and the
    # message must not call the ceiling 0.896 (which 0.895 would be under).
    four = memory_ceiling(accelerator("v5litepod-4"))
    assert "= 0.8961, rounded down to 0.89" in four.source and "0.896," not in four.source
    six = memory_ceiling(accelerator("v6e-1"))
    assert "= 0.9480, rounded down to 0.94, capped at the measured 0.92" in six.source
    assert "highest value seen to boot" in six.source


@pytest.mark.parametrize("accel", ["v6e-1", "v5litepod-4"])
def test_above_the_measured_cap_on_another_chip_is_labelled_derived(
        tmp_path: Path, accel: str) -> None:
    msg = _refusal(tmp_path, f'[tpu]\naccelerator_type = "{accel}"\n[gcp]\nzone = '
                   '"us-east5-a"\n[vllm]\ngpu_memory_utilization = 0.93\n')
    [line] = [x for x in msg.splitlines() if "gpu_memory_utilization = 0.93" in x]
    assert "must be <= 0.92" in line
    assert (f"[derived for {accel}: the cap measured on v5litepod-1 (SPEC 4), applied as a "
            "derived limit") in line


def test_above_the_cap_on_the_measured_chip_stays_measured(tmp_path: Path) -> None:
    msg = _refusal(tmp_path, "[vllm]\ngpu_memory_utilization = 0.93\n")
    [line] = [x for x in msg.splitlines() if "gpu_memory_utilization = 0.93" in x]
    assert "must be <= 0.92" in line and "derived" not in line
