"""Tuned profiles per (model, accelerator, image digest): the digest the boot's `image` phase
reported is the key, a tag-only image never uses a measurement (one line names the pin that
would), the overlay pins the measured build, and `plan` uses the measured figures of the very
config where they apply (labelled measured, with the file, node and date)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import invoke
from tests.tune.test_record import _tune
from tests.tune.test_record import setup as setup  # the fixture
from tests.tune.toy_node import TOY_DIGEST
from tpuserve.ops.boot_phases import parse_boot
from tpuserve.settings import ConfigError, load
from tpuserve.settings.learned_profiles import parse
from tpuserve.tune.node import boot_record

OTHER = "sha256:" + "5" * 64


def _profile(setup: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    (path,) = sorted((setup["tmp"] / "profiles").glob("*.toml"))
    return path, tomllib.loads(path.read_text())


def test_the_boot_phase_digest_is_the_boot_records() -> None:
    attrs = {"boot": "2026-12-02T07:00:00Z started",
             "image": f"2026-12-02T07:01:00Z pulled vllm/vllm-tpu:nightly digest={TOY_DIGEST}",
             "state": "2026-12-02T07:10:00Z ready"}
    assert boot_record(parse_boot(attrs)).digest == TOY_DIGEST
    # An image id (a local build) or no image phase names no pullable build.
    attrs["image"] = f"2026-12-02T07:01:00Z local x id={TOY_DIGEST} (no repo digest)"
    assert boot_record(parse_boot(attrs)).digest is None


def test_overlay_pins_the_measured_digest_and_plan_uses_its_figures(
        setup: dict[str, Any]) -> None:
    r = _tune(setup)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    overlay = Path(doc["overlay"]).read_text()
    assert f'image = "vllm/vllm-tpu:nightly@{TOY_DIGEST}"' in overlay
    _path, prof = _profile(setup)
    (m,) = prof["measured"]
    cells = {(c["context"], c["clients"]): c for c in m["cells"]}
    assert set(cells) == {(1024, 1), (1024, 16)}
    assert all(c["output_tokens"] == 256 and c["reps"] >= 1 for c in cells.values())
    # The overlay applied: the same digest and flags, so plan uses what was measured.
    env = {"TPUSERVE_CONFIG": f"{setup['cfg']}:{doc['overlay']}"}
    p = invoke("plan", "--stack", "flex", "--json", env=env)
    assert p.exit_code == 0, p.stderr
    plan = json.loads(p.stdout)
    tput = {(c["context"], c["clients"]): c["output_tokens_per_s"] for c in plan["throughput"]}
    for key, c in cells.items():
        assert tput[key] == c["tok_s"]
    usd_h = plan["provisioning"]["flex"]["usd_per_hour"]
    assert plan["provisioning"]["flex"]["usd_per_million_output_tokens"]["1024x16"] == \
        pytest.approx(usd_h / (cells[1024, 16]["tok_s"] * 3600) * 1e6)
    assert tput[128, 64] == 1496.5  # nothing measured there: SPEC 6's stays
    tuned = plan["sources"]["tuned"]
    assert tuned.startswith(f"measured by tpuserve tune on {m['date']}, node {m['node']}")
    assert str(_path) in tuned and "1024x16" in tuned
    assert plan["tuned"]["boot"]["seconds"] == m["boot_s"]
    kind = plan["tuned"]["boot"]["kind"]
    assert plan["rebuild_usd"][kind] == pytest.approx(
        plan["provisioning"]["spot"]["usd_per_hour"] * m["boot_s"] / 3600)
    text = invoke("plan", "--stack", "flex", env=env)
    assert text.exit_code == 0, text.stderr
    assert "1,024x16 m" in text.stdout and "m = measured by tpuserve tune" in \
        " ".join(text.stdout.split())


def test_another_digest_or_other_flags_use_nothing(setup: dict[str, Any]) -> None:
    r = _tune(setup)
    assert r.exit_code == 0, r.stderr
    overlay = Path(json.loads(r.stdout)["overlay"])
    other = overlay.with_name("other.toml")
    other.write_text(overlay.read_text().replace(TOY_DIGEST, OTHER))
    p = invoke("plan", "--stack", "flex", "--json",
               env={"TPUSERVE_CONFIG": f"{setup['cfg']}:{other}"})
    assert p.exit_code == 0, p.stderr
    assert "tuned" not in json.loads(p.stdout)
    (note,) = [ln for ln in p.stderr.splitlines() if "tuned profile exists" in ln]
    assert "pins another digest" in note and TOY_DIGEST in note
    # synth prints the loader's warnings: the same line.
    assert any("tuned profile exists" in w and TOY_DIGEST in w for w in load(
        environ={"TPUSERVE_CONFIG": f"{setup['cfg']}:{other}"}).warnings)
    # The digest pinned but another flag than measured: not this config's figures.
    flags = overlay.with_name("flags.toml")
    flags.write_text(overlay.read_text().replace("NUM_PRECOMPILE_WORKERS = 1",
                                                 "NUM_PRECOMPILE_WORKERS = 2")
                     .replace("NUM_PRECOMPILE_WORKERS = 4", "NUM_PRECOMPILE_WORKERS = 2"))
    p = invoke("plan", "--stack", "flex", "--json",
               env={"TPUSERVE_CONFIG": f"{setup['cfg']}:{flags}"})
    assert p.exit_code == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "tuned" not in doc and doc["sources"]["tuned"].startswith("not used")


def test_a_refusal_from_a_boot_before_the_image_phase_takes_the_last_good_build(
        setup: dict[str, Any]) -> None:
    setup["node"].failed_digest = None  # the failed boots never reached the image phase
    assert _tune(setup).exit_code == 0
    _path, prof = _profile(setup)
    assert prof["image_digest"] == TOY_DIGEST and prof["refusals"]
    # Pinned to another build, the refusal learned on this one does not refuse.
    mine = setup["cfg"]
    mine.write_text(mine.read_text() + f'\n[stacks.flex.vllm]\nimage = "vllm/vllm-tpu:nightly@'
                    f'{OTHER}"\ngpu_memory_utilization = 0.93\n'
                    'allow_untested_gpu_memory_utilization = true\n')
    load(environ=setup["env"])  # no ConfigError
    mine.write_text(mine.read_text().replace(OTHER, TOY_DIGEST))
    with pytest.raises(ConfigError) as err:
        load(environ=setup["env"])
    assert any(TOY_DIGEST in p and "failed to boot" in p for p in err.value.problems)


def test_no_digest_known_records_nothing_and_says_so(setup: dict[str, Any]) -> None:
    setup["node"].digest = setup["node"].failed_digest = None
    r = _tune(setup)
    assert r.exit_code == 0, r.stderr
    assert "profile" not in json.loads(r.stdout)
    assert not (setup["tmp"] / "profiles").exists()
    said = " ".join(r.stderr.split())
    assert said.count("not recorded: its boot reported no image digest") == \
        said.count("not recorded") >= 2  # the chosen config and the refusals
    assert "image: not pinned" in Path(json.loads(r.stdout)["overlay"]).read_text()


def test_a_version_1_profile_is_refused_in_one_line(setup: dict[str, Any]) -> None:
    profiles = setup["tmp"] / "profiles"
    profiles.mkdir()
    (profiles / "old.toml").write_text('version = 1\nmodel = "google/gemma-4-E2B-it"\n'
                                       'accelerator = "v5litepod-1"\n'
                                       'image = "vllm/vllm-tpu:nightly"\n')
    with pytest.raises(ConfigError) as err:
        load(environ=setup["env"])
    (line,) = [p for p in err.value.problems if "old.toml" in p]
    assert "version 1" in line and "digest" in line and "\n" not in line


@pytest.mark.parametrize("cell, why", [
    ("context = -1", "context"), ('tok_s = "fast"', "tok_s"), ("reps = 0", "reps"),
    ("tpot_p50_ms = true", "tpot_p50_ms")])
def test_hostile_cells_are_refused_in_one_line(tmp_path: Path, cell: str, why: str) -> None:
    good = {"context": "1024", "clients": "16", "output_tokens": "256", "tok_s": "100.0",
            "ttft_p90_ms": "300.0", "reps": "2"}
    key = cell.split(" = ")[0]
    fields = "\n".join(f"{k} = {v}" for k, v in good.items() if k != key) + "\n" + cell
    text = (f'version = 2\nmodel = "m/x"\naccelerator = "v5litepod-1"\nimage = "i:t"\n'
            f'image_digest = "{TOY_DIGEST}"\n[[measured]]\ndate = "2026-12-02"\nnode = "n"\n'
            'stack = "flex"\ncandidate = "c"\nworkload = "w"\nusd_per_m = 1.0\ntok_s = 1.0\n'
            f'boot_s = 1.0\nvalues = {{}}\n[[measured.cells]]\n{fields}\n')
    with pytest.raises(ValueError) as err:
        parse(tmp_path / "p.toml", text)
    assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("stack", ["spot", "ondemand", "flex"])
def test_a_vm_stack_accepts_the_pinned_reference_and_runs_it(tmp_path: Path, stack: str) -> None:
    from tpuserve.render.boot_script import render_startup

    pinned = f"vllm/vllm-tpu:nightly@{TOY_DIGEST}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[stacks.{stack}.vllm]\nimage = "{pinned}"\n')
    d = load(environ={"TPUSERVE_CONFIG": str(cfg)}).deployments[stack]
    assert d.vllm.image == pinned
    assert f"IMAGE={pinned}" in render_startup(d) or f"IMAGE='{pinned}'" in render_startup(d)
