"""`tpuserve bench [STACK] [--endpoint URL]`: the SPEC section 6 sweep, tables, JSON and a chart."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from tpuserve.ops import bench as engine
from tpuserve.ops import bench_report, server
from tpuserve.ops.bounded_http import Deadline
from tpuserve.ops.errors import EXIT_INTERRUPTED, OpsError
from tpuserve.settings import Deployment

from . import common
from .common import (
    ApiKeyOpt,
    CacertOpt,
    EndpointOpt,
    FingerprintOpt,
    JsonOpt,
    OptionalStackArg,
    command,
    console,
    emit_json,
    positive_ints,
)


def prices(d: Deployment | None) -> dict[str, float]:
    """$/hour of the whole slice per provisioning model: the deployment's prices for its chip in
    its region ([pricing] set, else tpuserve/prices)."""
    if d is None:
        found = common.deployments()
        d = next(iter(found.values()), None)
    if d is None:
        return {}
    chips = d.tpu.chips
    return {m: usd * chips for m, usd in d.chip_prices().items()}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@command
def bench(
    stack: OptionalStackArg = None,
    endpoint: EndpointOpt = None,
    api_key: ApiKeyOpt = None,
    fingerprint: FingerprintOpt = None,
    cacert: CacertOpt = None,
    contexts: Annotated[str, typer.Option(help="Prompt lengths in tokens (SPEC 6).")] = ",".join(
        map(str, engine.DEFAULT_CONTEXTS)
    ),
    clients: Annotated[str, typer.Option(help="Concurrent streams (SPEC 6).")] = ",".join(
        map(str, engine.DEFAULT_CLIENTS)
    ),
    repetitions: Annotated[int, typer.Option(help="Repetitions per cell (cv needs >= 2).",
                                             min=1)] = engine.DEFAULT_REPETITIONS,
    output_tokens: Annotated[int, typer.Option(help="Tokens generated per request.",
                                               min=2)] = engine.DEFAULT_OUTPUT_TOKENS,
    requests_per_client: Annotated[int, typer.Option(help="Requests per client per repetition.",
                                                     min=1)] = engine.DEFAULT_REQUESTS_PER_CLIENT,
    warmup: Annotated[bool, typer.Option(help="One unrecorded request before each cell.")] = True,
    ignore_eos: Annotated[bool, typer.Option(
        help="Send vLLM's ignore_eos so every answer has --output-tokens tokens (turn off for "
        "servers that reject it).")] = True,
    model: Annotated[str | None, typer.Option(help="Model id (default: the first of "
                                              "/v1/models).", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for any one chunk.",
                                           min=1)] = 600.0,
    request_deadline: Annotated[float, typer.Option(
        help="Seconds one request may take in all, whatever the server sends (a stream that "
        "trickles or never ends fails at this point).", min=1)] = engine.BenchPlan.deadline_s,
    deadline: Annotated[float | None, typer.Option(
        help="Seconds the whole bench may take (default: unbounded).", min=1,
        show_default=False)] = None,
    cold_connections: Annotated[bool, typer.Option(
        help="A new connection per request, so TTFT includes TCP/TLS setup (default: "
        "connections are opened and warmed before each cell).")] = False,
    out: Annotated[Path, typer.Option(help="Directory for the JSON and the PNG chart.")] = Path(
        "out"
    ),
    chart: Annotated[bool, typer.Option(help="Write the PNG chart.")] = True,
    json_output: JsonOpt = False,
) -> None:
    """Aggregate output tok/s, median and p90 TTFT, per-stream tok/s, TPOT and their cv across
    repetitions, per context x clients; $/M output tokens per provisioning model. Writes
    bench-NAME-TIME.json (the planner's throughput table) and .png to --out."""
    plan = engine.BenchPlan(
        contexts=positive_ints("--contexts", contexts), clients=positive_ints("--clients", clients),
        repetitions=repetitions, output_tokens=output_tokens,
        requests_per_client=requests_per_client, warmup=warmup, ignore_eos=ignore_eos,
        timeout_s=timeout, deadline_s=request_deadline, run_deadline_s=deadline,
        cold=cold_connections,
    )
    overall = Deadline(deadline)  # the target's lookup (TPU API, certificate) included
    d = common.load_stack(stack) if stack and not endpoint else None
    if d is not None and d.kind.on_gke:  # the Gateway's address: plain HTTP or a public CA
        target = common.fleet_target(d, api_key, pinned=bool(fingerprint or cacert),
                                     deadline=overall)
    else:
        target, d = common.resolve_target(stack, endpoint, api_key, fingerprint, cacert,
                                          deadline=overall)
    # The calls before the sweep (models, prompt calibration) share its deadline, or
    # PREFLIGHT_DEADLINE_S when it has none.
    left = overall.remaining()
    preflight = (overall if deadline is not None and deadline <= engine.PREFLIGHT_DEADLINE_S
                 else Deadline(engine.PREFLIGHT_DEADLINE_S if left is None
                               else min(left, engine.PREFLIGHT_DEADLINE_S)))
    with server.http_client(min(timeout, 60.0), verify=target.ssl_context,
                            deadline=preflight) as http:
        served, mml = server.served_model(http, target)
        model_id = model or served
        plan.validate(mml or (d.vllm.max_model_len if d else None))
        words, counted, method = engine.calibrate_prompts(
            plan.contexts, lambda msgs: server.tokenize_count(http, target, model_id, msgs)
        )
    common.log(f"bench {target.base_url} model {model_id}: prompt lengths by {method}; "
               f"{len(plan.contexts) * len(plan.clients)} cells x {plan.repetitions} reps")
    try:
        result = asyncio.run(engine.run_bench(
            target, model_id, plan, words, prompt_length_method=method,
            prompt_tokens_target=counted, progress=common.log,
            seconds_left=None if deadline is None else max(overall.remaining() or 0.0, 0.001),
        ))
    except KeyboardInterrupt:
        raise OpsError("bench interrupted: every stream was closed; no results were written",
                       exit_code=EXIT_INTERRUPTED) from None
    usd = prices(d)
    doc: dict[str, Any] = result.to_json(usd)
    doc["stack"] = d.name if d else None
    label = d.name if d else re.sub(r"[^A-Za-z0-9.-]+", "-", target.base_url.split("://")[-1])
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = out / f"bench-{label}-{stamp}.json"
    _write_atomic(json_path, (json.dumps(doc, indent=2) + "\n").encode())
    doc["json_path"] = str(json_path)
    if chart and result.cells:
        png_path = bench_report.write_chart(
            result.cells, out / f"bench-{label}-{stamp}.png", title=f"{model_id} at {label}"
        )
        doc["chart_path"] = str(png_path)
    if json_output:
        emit_json(doc)
    else:
        for table in bench_report.tables(result.cells, usd):
            console.print(table)
        console.print(f"JSON (planner input): {json_path}")
        if "chart_path" in doc:
            console.print(f"chart: {doc['chart_path']}")
    if result.errors:
        common.log(f"tpuserve: error: {result.errors} request(s) failed (see 'errors' and "
                   "'first_error' in the JSON)")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
