"""main.py as cdktf runs it: config errors stop synth before any file is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_main(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    user = tmp_path / "user.toml"
    user.write_text(toml)
    env = {**os.environ, "TPUSERVE_CONFIG": str(user), "PYTHONPATH": str(ROOT)}
    env.pop("CDKTF_OUTDIR", None)
    return subprocess.run([sys.executable, str(ROOT / "main.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_errors_are_listed_together_and_nothing_is_written(tmp_path: Path) -> None:
    proc = run_main(tmp_path, '[vllm]\ngpu_memory_utilization = 0.95\nkv_cache_dtype = "int8"\n'
                              '[tpu]\naccelerator_type = "v5e-1"\n')
    assert proc.returncode == 1
    assert "vllm.gpu_memory_utilization = 0.95" in proc.stderr
    assert "vllm.kv_cache_dtype = 'int8'" in proc.stderr
    assert "tpu.accelerator_type = 'v5e-1'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cdktf.out").exists()


def test_warnings_are_printed_and_synth_proceeds(tmp_path: Path) -> None:
    proc = run_main(tmp_path, '[vllm]\nkv_cache_dtype = "fp8"\n')
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: [") == 3 and "1.000x" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "cdktf.out" / "stacks").iterdir()) == [
        "flex", "ondemand", "spot"]


def test_capacity_rules_stop_synth_too(tmp_path: Path) -> None:
    proc = run_main(tmp_path, "[stacks.spot.vllm]\nmax_model_len = 524288\n"
                              "[stacks.flex.vllm]\nkv_cache_dtype = 'nvfp4'\n")
    assert proc.returncode == 1
    assert "[spot] vllm.max_model_len = 524288" in proc.stderr and "pool holds" in proc.stderr
    assert "[flex] vllm.kv_cache_dtype = 'nvfp4'" in proc.stderr
    assert not (tmp_path / "cdktf.out").exists()
