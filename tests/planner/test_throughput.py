"""planner/throughput.py: the table `plan` prices by. SPEC 6 itself for the measured pair, a
bench of the deployment as given, else every SPEC 6 cell derived for the model on its slice by
the same scaling `plan --placements` uses (so the two cannot disagree on a cell)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tpuserve.accelerators import ACCELERATORS
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.planner.arithmetic import SPEC_THROUGHPUT, ThroughputCell, ThroughputTable
from tpuserve.planner.throughput import (
    SPEC6_SOURCE,
    geometry_of,
    is_measured_pair,
    plan_throughput,
    spec6_reference,
    throughput,
)
from tpuserve.settings import Deployment, load

GRANITE = "ibm-granite/granite-3b-code-instruct-128k"


def deployment(tmp_path: Path, toml: str) -> Deployment:
    (tmp_path / "user.toml").write_text(toml)
    return load(environ={"TPUSERVE_CONFIG": str(tmp_path / "user.toml")}).deployments["spot"]


def granite(tmp_path: Path) -> Deployment:
    models = DEFAULT_CONFIG.parent / "models" / GRANITE
    for name in ("config.json", "model.safetensors.index.json"):
        shutil.copyfile(models / name, tmp_path / name)
    return deployment(tmp_path, (
        '[tpu]\naccelerator_type = "v5litepod-4"\n'
        f'[vllm]\nmodel = "{GRANITE}"\n[capacity]\nmodel_geometry = "config.json"\n'
        'weights_index = "model.safetensors.index.json"\n'))


def test_the_measured_pair_is_spec_6_itself() -> None:
    d = load(environ={}).deployments["spot"]
    assert is_measured_pair(d)
    t = plan_throughput(d)
    assert t.table is SPEC_THROUGHPUT and t.measured and t.source == SPEC6_SOURCE


def test_another_model_is_derived_at_every_cell_as_placements_derive(tmp_path: Path) -> None:
    d = granite(tmp_path)
    assert not is_measured_pair(d)
    t = plan_throughput(d)
    assert not t.measured and t.source.startswith(f"derived: {GRANITE} on v5litepod-4 (TP 4)")
    ref, a = spec6_reference(), ACCELERATORS["v5litepod-4"]
    assert [(c.context, c.clients) for c in t.table.cells] == [
        (c.context, c.clients) for c in SPEC_THROUGHPUT.cells]
    for cell, spec in zip(t.table.cells, SPEC_THROUGHPUT.cells, strict=True):
        one = throughput(ref, GRANITE, geometry_of(d), a, 4, cell.context, cell.clients)
        assert cell.output_tokens_per_s == one.tok_s and not one.measured
        assert cell.output_tokens_per_s != spec.output_tokens_per_s


def test_the_measured_model_on_another_slice_is_not_the_measured_pair(tmp_path: Path) -> None:
    d = deployment(tmp_path, '[gcp]\nzone = "us-east5-a"\n[tpu]\naccelerator_type = "v6e-1"\n')
    assert not is_measured_pair(d)
    assert not plan_throughput(d).measured


def test_a_bench_of_the_deployment_is_taken_as_given(tmp_path: Path) -> None:
    d = granite(tmp_path)
    bench = ThroughputTable((ThroughputCell(1024, 16, 500.0),))
    t = plan_throughput(d, bench, "--throughput 'b.json'")
    assert t.table is bench and t.measured
    assert t.source == f"measured (--throughput 'b.json': {GRANITE}, v5litepod-4)"
