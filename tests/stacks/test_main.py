"""main.py as cdktf runs it: config errors stop synth before any file is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import main
from tpuserve.paths import REPO_ROOT


def run_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str) -> int:
    """main.main() in tmp_path (cdktf.out lands in the cwd), with a user config file."""
    user = tmp_path / "user.toml"
    user.write_text(toml)
    monkeypatch.setenv("TPUSERVE_CONFIG", str(user))
    monkeypatch.delenv("TPUSERVE_PROJECT", raising=False)
    monkeypatch.delenv("CDKTF_OUTDIR", raising=False)
    monkeypatch.chdir(tmp_path)
    return main.main()


def test_errors_are_listed_together_and_nothing_is_written(tmp_path, monkeypatch, capsys) -> None:
    code = run_main(tmp_path, monkeypatch,
                    '[vllm]\ngpu_memory_utilization = 0.95\nkv_cache_dtype = "int8"\n'
                    '[tpu]\naccelerator_type = "v5e-1"\n')
    err = capsys.readouterr().err
    assert code == 1
    assert "vllm.gpu_memory_utilization = 0.95" in err
    assert "vllm.kv_cache_dtype = 'int8'" in err
    assert "tpu.accelerator_type = 'v5e-1'" in err
    assert not (tmp_path / "cdktf.out").exists()


def test_capacity_rules_stop_synth_too(tmp_path, monkeypatch, capsys) -> None:
    code = run_main(tmp_path, monkeypatch, "[stacks.spot.vllm]\nmax_model_len = 524288\n"
                                           "[stacks.flex.vllm]\nkv_cache_dtype = 'nvfp4'\n")
    err = capsys.readouterr().err
    assert code == 1
    assert "[spot] vllm.max_model_len = 524288" in err and "pool holds" in err
    assert "[flex] vllm.kv_cache_dtype = 'nvfp4'" in err
    assert not (tmp_path / "cdktf.out").exists()


def test_warnings_are_printed_and_synth_proceeds(tmp_path, monkeypatch, capsys) -> None:
    assert run_main(tmp_path, monkeypatch, '[vllm]\nkv_cache_dtype = "fp8"\n') == 0
    err = capsys.readouterr().err
    assert err.count("1.000x") == 4  # each of spot, ondemand, flex and fleet
    # and the fleet's digest and domain, and spot v5e cheaper in another region (the spot
    # stack's and the fleet's spot pool's)
    assert err.count("warning: [") == 4 + 2 + 2
    assert err.count("pricing.spot: v5litepod-1 spot costs") == 2
    assert sorted(p.name for p in (tmp_path / "cdktf.out" / "stacks").iterdir()) == [
        "base", "fleet", "flex", "ondemand", "spot"]


@pytest.mark.parametrize(("toml", "needle"), [
    ("[vllm\nport = 1", "not valid TOML"),
    ('stacks = "spot"', "stacks = 'spot': must be a table of stacks"),
    ("[stacks]\nspot = 5", "[spot] stacks.spot = 5: must be a table"),
    ('name = "evil"', "name: set by the loader itself"),
    ('vllm = "x"', "vllm = 'x': Input should be a valid dictionary"),
    ('[vllm]\nport = "8000"', "vllm.port = '8000': Input should be a valid integer"),
    ('[access]\nproxy_image = "nginx\\nNGINX_CONF\\nid"', "access.proxy_image = 'nginx\\nNGINX"),
])
def test_malformed_input_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys, toml: str,
                                                      needle: str) -> None:
    assert run_main(tmp_path, monkeypatch, toml) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert err.startswith("tpuserve: invalid configuration:\n  - ")
    assert not (tmp_path / "cdktf.out").exists()


def test_an_unreadable_config_file_is_a_message(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "missing.toml"))
    monkeypatch.chdir(tmp_path)
    assert main.main() == 1
    assert "TPUSERVE_CONFIG = " in capsys.readouterr().err


def test_the_synth_summary_names_the_base_and_every_serving_stack(synthesized) -> None:
    from tpuserve.synth_summary import summarize

    lines = {name: summarize(name, doc) for name, doc in synthesized.items()}
    assert lines["base"].startswith("base      long-lived base (2 secrets, 2 buckets")
    assert "/month dormant" in lines["base"]
    assert lines["spot"].startswith("spot      TPU VM tpuserve-spot (v5litepod-1, spot)")
    assert lines["flex"].startswith("flex      flex-start queued resource")
    assert lines["fleet"].startswith("fleet     GKE fleet: 1-4 one-chip replicas in tpu-flex, "
                                     "tpu-spot")


def test_the_synth_summary_fails_in_one_line(tmp_path: Path) -> None:
    # `./dev synth` runs it after cdktf: a stack it cannot read is one line and exit 1.
    bad = tmp_path / "stacks" / "flex"
    bad.mkdir(parents=True)
    (bad / "cdk.tf.json").write_text('{"resource": []}')
    for outdir in (tmp_path, tmp_path / "absent"):
        done = subprocess.run([sys.executable, "-m", "tpuserve.synth_summary", str(outdir)],
                              capture_output=True, text=True, cwd=REPO_ROOT)
        assert done.returncode == 1
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_stack_switched_off_is_not_synthesized_and_the_rest_is(tmp_path, monkeypatch,
                                                                 capsys) -> None:
    # europe-west4-a refuses flex-start for v5litepod-1 (SPEC 1): with flex off, the zone
    # still synthesizes the base and the other stacks (the fleet off too: it is no exception).
    monkeypatch.setenv("TPUSERVE_ZONE", "europe-west4-a")
    code = run_main(tmp_path, monkeypatch,
                    "[stacks.flex]\nenabled = false\n[stacks.fleet]\nenabled = false\n")
    err = capsys.readouterr().err
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "cdktf.out" / "stacks").iterdir()) == [
        "base", "ondemand", "spot"]
    assert "[flex]" not in err and "[fleet]" not in err
