"""`tpuserve plan`: the capacity and cost planner (SPEC 5-7) for one stack, as tables or JSON.

Overrides go through the config's own validators, so `--gpu-memory-utilization 0.95` is
refused with the same measured rule as synth would give, one line per problem.
"""

# No `from __future__ import annotations`: typer would evaluate each option's annotation from
# its string on every run (bench/cli).

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuserve.facts import E2B_WEIGHTS_GIB
from tpuserve.kinds import KINDS, STACK_NAMES
from tpuserve.ops.errors import EXIT_USAGE, OpsError
from tpuserve.planner.arithmetic import ThroughputTable, load_geometry, load_throughput
from tpuserve.planner.base_cost import dormant_base
from tpuserve.planner.geometry import GeometryError
from tpuserve.planner.throughput import PlanThroughput, bench_reference, plan_throughput
from tpuserve.prices import sources_line
from tpuserve.settings import ConfigError, Deployment, from_raw, load_raw
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.loader import all_warnings, deep_merge, switched_off
from tpuserve.settings.model_inputs import plan_sources

from .common import JsonOpt, command, console, emit_json, err_console

if TYPE_CHECKING:
    from tpuserve.planner.tuned import Tuned

_FILE = {"exists": True, "dir_okay": False, "readable": True, "show_default": False}


# The stack `plan` reads without --stack: the flex-start TPU VM's (picked by its capacity flag,
# never by name), else the first enabled stack in the kinds' order.
_PREFERRED = next(k.name for k in KINDS if k.queued_resource)


def default_stack(raw: Mapping[str, Any]) -> str:
    """The preferred stack where it is configured and on; else the first that is (kinds'
    order, then any other configured name); else the preferred one (its error says why)."""
    stacks = raw.get("stacks", {})
    if not isinstance(stacks, Mapping):
        return _PREFERRED
    off = switched_off(raw)
    names = [_PREFERRED, *STACK_NAMES, *(s for s in stacks if s not in STACK_NAMES)]
    return next((s for s in names if s in stacks and s not in off), _PREFERRED)


def _stack_deployment(stack: str | None, vllm: dict[str, Any],
                      capacity: dict[str, Any]) -> Deployment:
    """The configured stack with the overrides merged into its [stacks.NAME] table."""
    raw = load_raw()
    stack = default_stack(raw) if stack is None else stack
    stacks = raw.get("stacks", {})
    if not isinstance(stacks, Mapping) or not isinstance(stacks.get(stack, {}), Mapping):
        from_raw(raw)  # a malformed [stacks] table: the loader's message (ConfigError)
    off = switched_off(raw)  # `[stacks.NAME] enabled = false`: not configured, for the plan
    if stack not in stacks or stack in off:
        configured = ", ".join(s for s in STACK_NAMES if s in stacks and s not in off) or "none"
        raise OpsError(f"--stack {stack!r}: not in the configuration (configured: {configured})",
                       exit_code=EXIT_USAGE)
    over = {k: v for k, v in (("vllm", vllm), ("capacity", capacity)) if v}
    # Validate only this stack: another stack's problem is not this command's business. Its
    # warnings: plan words them itself (all_warnings below), so the loader need not as well.
    only = {**raw, "stacks": {stack: deep_merge(stacks[stack], over)}}
    return from_raw(only, warnings=False).deployments[stack]


def _check_model_config(path: Path) -> None:
    """The geometry file on its own first, so its problems name the flag, not the setting."""
    try:
        load_geometry(path)
    except GeometryError as exc:
        raise ConfigError([f"--model-config {str(path)!r}: {p}" for p in exc.problems]) from None
    except OSError as exc:
        raise ConfigError([f"--model-config {str(path)!r}: {exc.strerror}"]) from None


def _throughput(path: Path | None) -> ThroughputTable | None:
    if path is None:
        return None
    try:
        return load_throughput(path)
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise OpsError(f"--throughput {str(path)!r}: {exc}", exit_code=EXIT_USAGE) from None


def _finite(value: Any) -> Any:
    """JSON has no Infinity: a break-even that never comes is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@command
def plan(
    stack: Annotated[str | None, typer.Option(
        "--stack", help=f"Stack: {', '.join(STACK_NAMES)} (default: {_PREFERRED}, else the "
        "first enabled stack).", show_default=False)] = None,
    model_config: Annotated[Path | None, typer.Option(
        "--model-config", help="A Hugging Face config.json (top level or text_config) instead "
        "of the configured geometry.", **_FILE)] = None,
    weights_gib: Annotated[float | None, typer.Option(
        "--weights-gib", help="Resident weights in GiB (measured: "
        f"{E2B_WEIGHTS_GIB} for Gemma 4 E2B).",
        show_default=False)] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(
        "--gpu-memory-utilization", help="Override vllm.gpu_memory_utilization.",
        show_default=False)] = None,
    kv_cache_memory_bytes: Annotated[int | None, typer.Option(
        "--kv-cache-memory-bytes", help="Override vllm.kv_cache_memory_bytes (the KV pool).",
        show_default=False)] = None,
    max_model_len: Annotated[int | None, typer.Option(
        "--max-model-len", help="Override vllm.max_model_len.", show_default=False)] = None,
    tensor_parallel_size: Annotated[int | None, typer.Option(
        "--tensor-parallel-size", help="Override vllm.tensor_parallel_size.",
        show_default=False)] = None,
    throughput: Annotated[Path | None, typer.Option(
        "--throughput", help="A `bench` JSON throughput table instead of SPEC 6.",
        **_FILE)] = None,
    png: Annotated[Path | None, typer.Option(
        "--png", help="Also write a chart: HBM budget and $/M output tokens against clients.",
        dir_okay=False, show_default=False)] = None,
    placements: Annotated[bool, typer.Option(
        "--placements", help="Compare every (accelerator, zone, provisioning model) the model "
        "fits and the zone offers: $/h, tok/s and $/M output tokens at capacity.expected_"
        "context x expected_clients, each figure measured or derived.")] = False,
    json_output: JsonOpt = False,
) -> None:
    """HBM budget, KV cache, blocks, KV wall, decode floor and $/M output tokens (SPEC 5-7)."""
    vllm = {k: v for k, v in (
        ("gpu_memory_utilization", gpu_memory_utilization),
        ("kv_cache_memory_bytes", kv_cache_memory_bytes),
        ("max_model_len", max_model_len),
        ("tensor_parallel_size", tensor_parallel_size),
    ) if v is not None}
    capacity: dict[str, Any] = {}
    if model_config is not None:
        capacity["model_geometry"] = str(model_config.resolve())  # absolute wins over config/
    if weights_gib is not None:
        capacity["weights_gib"] = weights_gib
    try:
        if model_config is not None:
            _check_model_config(model_config)
        d = _stack_deployment(stack, vllm, capacity)
        stack = d.name  # the default's pick, where --stack was not given
    except ConfigError as exc:
        # One line per problem: each already names the setting, the value and the rule.
        for problem in exc.problems:
            err_console.print(f"tpuserve: error: {problem}", markup=False, soft_wrap=True)
        if json_output:
            emit_json({"ok": False, "errors": exc.problems, "exit_code": EXIT_USAGE})
        raise typer.Exit(EXIT_USAGE) from None
    table = _throughput(throughput)
    # Measured for the measured pair (or a bench of this deployment), else derived: never
    # another model's or slice's figures in this one's place (planner/throughput.py).
    tput = plan_throughput(d, table, _bench_label(throughput))
    # The user's own tune measurement of this very config (image digest and flags), used in
    # place of what it measured: cells (unless --throughput gives a bench) and a boot.
    tuned, tuned_line = _tuned(d)
    if tuned is not None and table is not None:
        tuned = type(tuned)(tuned.profile, replace(tuned.measured, cells=()))
        tuned_line = tuned.source()
    result = plan_for(d, throughput=tput.table if tuned is None else tuned.table(tput.table),
                      **({} if tuned is None or tuned.boot_kind is None else
                         {f"{tuned.boot_kind}_start_s": tuned.measured.boot_s}))
    for warning in all_warnings(d):
        err_console.print(f"tpuserve: warning: [{stack}] {warning}", markup=False,
                          soft_wrap=True)
    # The fleet: N replicas of this one-chip plan on GKE (its first-choice pool prices a chip).
    fleet = None
    if d.kind.on_gke:
        from tpuserve.planner.fleet_cost import fleet_for  # the fleet's only: not on every start

        fleet = fleet_for(d, result, throughput_source=None if tput.measured else tput.source)
    if png is not None:
        from tpuserve.planner import (
            report as plan_report,  # matplotlib and rich: only when they are used
        )

        plan_report.write_png(result, png, provisioning=d.price_key, derived=not tput.measured)
        err_console.print(f"wrote {png}", markup=False)
    if placements:
        _placements(d, table, throughput, json_output)
        return
    # What stays billed after `cdktf destroy STACK`: the deployment's base.
    dormant = dormant_base()
    # `tuned`: the user's own measurement of this (model, accelerator, image digest).
    tuned_keys = ", ".join(c.key for c in tuned.cells) if tuned is not None else ""
    sources = {**plan_sources(d), "throughput": tput.source + (
                   f"; {tuned_keys} measured by tpuserve tune instead (tuned)" if tuned_keys
                   else ""),
               "prices": sources_line(d.sourced_prices()),  # each $ figure's (docs/prices.md)
               **({} if tuned_line is None else {"tuned": tuned_line})}
    if json_output:
        emit_json(_finite({"stack": stack, "provisioning_model": d.stack.provisioning_model,
                           **result.to_json(),
                           "base": {"deployment": d.gcp.deployment, **dormant.as_json()},
                           **({} if fleet is None else {"fleet": fleet.as_json()}),
                           **({} if tuned is None else {"tuned": tuned.as_json()}),
                           "sources": sources}))
        return
    from tpuserve.planner import report as plan_report

    console.print(f"[bold]{stack}[/] ({d.stack.provisioning_model}, {d.tpu.accelerator_type}, "
                  f"{d.vllm.model})")
    labels: dict[str, str] = {}
    if not sources["weights_bytes"].startswith("measured"):
        labels["weights"] = ("weights (capacity.weights_gib)" if sources["weights_bytes"]
                             .startswith("capacity.") else "weights (derived: index total_size)")
    labels.update(_throughput_labels(tput))
    labels.update(_tuned_labels(tuned, result))
    if "boot_times" in sources:  # SPEC 4's boots stand in: the rebuild table says so
        labels["rebuild_legend"] = ("seconds d = derived: Gemma 4 E2B's boots on v5litepod-1 "
                                    "(SPEC 4), not this model's or chip's; the $ and "
                                    "break-even follow (boot_times: below)")
    plan_report.print_plan(result, console, labels)
    # Only what is not measured: the default deployment's table stays as it was.
    for name, source in sources.items():
        if not source.startswith("measured") or name == "tuned":
            console.print(f"{name}: {source}", markup=False, soft_wrap=True)
    if fleet is not None:
        from tpuserve.planner import fleet_report

        fleet_report.print_fleet(fleet, console)
    console.print(
        f"base `{d.gcp.deployment}` (kept by `cdktf destroy {stack}`): "
        f"${dormant.usd_per_month:.2f}/month dormant = {dormant.secret_versions} secret versions "
        f"${dormant.secrets_usd_per_month:.2f} + one compile cache ({dormant.cache_gib:.2f} GiB, "
        f"SPEC 4) ${dormant.storage_usd_per_month:.4f}; list prices, not measured. Staged "
        f"weights (the fleet) add ${dormant_base(weights_staged=True).storage_usd_per_month:.2f}"
        ".", markup=False, soft_wrap=True)


def _tuned(d: Deployment) -> tuple["Tuned | None", str | None]:
    """planner/tuned.py's tuned_for. With no capacity.profiles_dir there is no profile to read
    (learned_profiles._of_pair): none, and the profile readers stay unimported (bench/cli)."""
    if d.capacity.profiles_dir_path is None:
        return None, None
    from tpuserve.planner.tuned import tuned_for

    return tuned_for(d)


def _bench_label(path: Path | None) -> str:
    return "--throughput" if path is None else f"--throughput {str(path)!r}"


def _throughput_labels(tput: PlanThroughput) -> dict[str, str]:
    """The text table's marks for a derived throughput (none for a measured one)."""
    if tput.measured:
        return {}
    return {"tok_s": "derived output tok/s (d)", "tok_s_mark": "d",
            "tok_s_legend": ("tok/s d = derived: this model's tok/s on this slice, scaled from "
                             "measured SPEC 6 (Gemma 4 E2B, v5litepod-1) by bytes per decode "
                             "step and bandwidth (throughput: below); every $/M figure is "
                             "computed from it")}


def _tuned_labels(tuned: "Tuned | None", result: Any) -> dict[str, str]:
    """The rows the tune measurement fills, marked `m` in the $/M and rebuild tables."""
    if tuned is None:
        return {}
    out = {"tuned_cells": ",".join(c.key for c in tuned.cells),
           "tuned_legend": f"m = {tuned.where} (tuned: below)"}
    if tuned.boot_kind is not None:
        out["tuned_boot"] = tuned.boot_kind
    e = result.expected
    if e is not None and f"{e.context}x{e.clients}" in out["tuned_cells"].split(","):
        out["tok_s"] = "measured output tok/s (tpuserve tune)"
    return out


def _placements(d: Deployment, table: ThroughputTable | None, path: Path | None,
                json_output: bool) -> None:
    """`--placements`: every placement ranked (planner/placements.py)."""
    from tpuserve.planner import placement_report
    from tpuserve.planner.placements import build_placements

    # A bench of the configured deployment: the measured point is its model on its slice.
    reference = (None if table is None or path is None else
                 bench_reference(d, table, _bench_label(path)))
    ranked = build_placements(d, reference=reference)
    if json_output:
        emit_json(_finite({"stack": d.name, **ranked.as_json()}))
        return
    placement_report.print_placements(ranked, console)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
