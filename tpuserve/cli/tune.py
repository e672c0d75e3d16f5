"""`tpuserve tune STACK`: the measured flag search on the stack's own node (tpuserve/tune/)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from tpuserve.ops.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, OpsError

from . import common
from .common import StackArg, command, console, emit_json, positive_ints

EXIT_BUDGET = 3
DEFAULT_CONTEXTS, DEFAULT_CLIENTS = "1024,8192", "1,16,64"
MIN_POLL_S, MIN_BOOT_TIMEOUT_S = 0.05, 120.0


def node_for(d: Any, raw: Any, workload: Any, api_key: str | None) -> Any:
    """The stack's node as a TuneNode (tpuserve/tune/tpu_node.py: the TPU API's metadata
    patch, the watcher's re-run, guest-attribute boot phases; the benchmark measures)."""
    from tpuserve.gcp.retry import RetryPolicy
    from tpuserve.tune import tpu_node
    from tpuserve.tune.bench_measure import bench_measure
    from tpuserve.tune.tpu_node import TpuNode

    measure = bench_measure(lambda: common.resolve_target(d.name, None, api_key)[0],
                            d.vllm.max_model_len, common.log)
    # A simulated node boots TPUSERVE_TIME_SCALE times faster: poll in proportion (a 15 s
    # poll would dwarf a 2 s simulated boot; a floor so 0 does not spin), bound the wait
    # likewise with room for the fakes' own seconds, and read its boots in node seconds.
    scale = RetryPolicy.from_env().time_scale
    timeout = tpu_node.BOOT_TIMEOUT_S
    if 0 < scale < 1:
        timeout = max(timeout * scale, MIN_BOOT_TIMEOUT_S)
    tpu = common.tpu_api()
    if hasattr(tpu, "poll_interval"):  # nodes.patch's operation: polled 5 s apart
        tpu.poll_interval = max(tpu.poll_interval * scale, MIN_POLL_S)
    return TpuNode(d, raw, tpu, measure=measure, time_scale=scale,
                   poll_s=max(tpu_node.POLL_S * scale, MIN_POLL_S), boot_timeout_s=timeout)




NOT_STARTED = "not started"


def _confirm_or_exit() -> None:
    """Ask before spending node time. A "no" (or Ctrl-C) is the user stopping the run before
    anything ran: exit 130, as an interruption, not 1 (nothing failed) and not 0 (nothing was
    done, so `tune && deploy` must not go on). No answer at all (end of input: a script without
    --yes) is a usage error: exit 2."""
    import sys

    typer.echo("start? [y/N]: ", err=True, nl=False)
    try:
        line = sys.stdin.readline()
    except KeyboardInterrupt:
        line = "n\n"
    if not sys.stdin.isatty():  # no terminal echoed the answer's newline
        typer.echo("", err=True)
    if not line:
        raise OpsError(f"{NOT_STARTED}: no answer to the question (end of input); pass --yes "
                       "to start without asking", exit_code=EXIT_USAGE)
    if line.strip().lower() not in ("y", "yes"):
        raise OpsError(f"{NOT_STARTED}: declined, nothing was booted (pass --yes to start "
                       "without asking)", exit_code=EXIT_INTERRUPTED)


def _limit_help(key: str, what: str) -> Any:
    return typer.Option(min=0.001, show_default=False,
                        help=f"{what}, in every measured cell (default: [tune] {key}).")


TtftLimit = Annotated[float | None, _limit_help(
    "max_ttft_p90_ms", "Highest p90 time to first token in ms")]
TpotLimit = Annotated[float | None, _limit_help(
    "max_tpot_p50_ms", "Highest median time per output token in ms")]
StreamLimit = Annotated[float | None, _limit_help(
    "min_stream_tok_s", "Lowest output tok/s of one stream")]


def _throughput(d: Any) -> Any:
    """The planner's throughput table for the estimate (SPEC 6's measured grid by default)."""
    from tpuserve.planner.arithmetic import SPEC_THROUGHPUT
    from tpuserve.settings.capacity import plan_for

    try:
        return plan_for(d).throughput
    except (OSError, ValueError):
        return SPEC_THROUGHPUT


@command
def tune(
    stack: StackArg,
    contexts: Annotated[str, typer.Option(help="Prompt lengths in tokens.")] = DEFAULT_CONTEXTS,
    clients: Annotated[str, typer.Option(
        help="Concurrent streams (with --trace: the levels the trace is replayed at).")
    ] = DEFAULT_CLIENTS,
    output_tokens: Annotated[int, typer.Option(help="Tokens generated per request.",
                                               min=2)] = 256,
    trace: Annotated[Path | None, typer.Option(
        help='A request trace instead of the cells: JSON Lines of {"prompt_tokens": int, '
        '"output_tokens": int}.', show_default=False)] = None,
    repetitions: Annotated[int, typer.Option(
        help="Repetitions at the first rung (doubled at each later one; cv needs >= 2).",
        min=1)] = 2,
    max_ttft_p90_ms: TtftLimit = None,
    max_tpot_p50_ms: TpotLimit = None,
    min_stream_tok_s: StreamLimit = None,
    budget_usd: Annotated[float | None, typer.Option(
        help="Stop (exit 3) before a candidate would take the cost past this.", min=0,
        show_default=False)] = None,
    budget_hours: Annotated[float | None, typer.Option(
        help="Stop (exit 3) before a candidate would take the node time past this.", min=0,
        show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Start without asking.")] = False,
    keep_best: Annotated[bool, typer.Option(
        "--keep-best", help="Leave the node on the chosen config (status and review report "
        "the drift until the overlay is deployed).")] = False,
    write: Annotated[Path | None, typer.Option(
        help="Write the overlay ([stacks.NAME]) here.", show_default=False)] = None,
    out: Annotated[Path, typer.Option(help="Directory for the report and chart.")] = Path("out"),
    state: Annotated[Path | None, typer.Option(
        help="State file (default: .tpuserve/tune-STACK.json beside the config).",
        show_default=False)] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore a saved state.")] = False,
    pr: Annotated[bool, typer.Option("--pr", help="Commit the overlay on a branch and open a "
                                     "pull request with gh (or print the commands).")] = False,
    record: Annotated[bool | None, typer.Option(
        "--record/--no-record", help="When the search is over, record the chosen config's "
        "figures and every failed boot in [capacity] profiles_dir (the default when it is "
        "set).",
        show_default=False)] = None,
    api_key: common.ApiKeyOpt = None,
    json_output: common.JsonOpt = False,
) -> None:
    """Search the stack's serving flags on its own node: candidates from the planner, applied
    in place, measured with the project's benchmark, chosen for $/M output tokens under your
    constraints; writes a TOML overlay, a Markdown report and a Pareto chart. Exit codes: 0
    done, 1 failed (also: the node went away; the same command resumes on the next one), 2
    usage (also: no answer to the start question without --yes), 3 budget reached, 130
    interrupted (also: the start question answered no; nothing ran)."""
    from tpuserve.settings.loader import from_raw, load_raw
    from tpuserve.tune import estimate as cost
    from tpuserve.tune import session
    from tpuserve.tune.result import Summary
    from tpuserve.tune.runner import BUDGET, DONE, FAILED, INTERRUPTED, Budget, Tuner
    from tpuserve.tune.state import TERRAFORM
    from tpuserve.tune.workload import Workload, read_trace

    common.load_stack(stack)  # the stack's name and presence, one line each
    raw = load_raw()
    d = from_raw(raw).deployments[stack]
    session.refuse_fleet(d)
    if record and d.capacity.profiles_dir is None:
        raise OpsError("--record: set [capacity] profiles_dir to the directory of your own "
                       "profiles (tune records its runs there)", exit_code=EXIT_USAGE)
    record = d.capacity.profiles_dir is not None if record is None else record
    limits = session.constraints(d, max_ttft_p90_ms=max_ttft_p90_ms,
                                 max_tpot_p50_ms=max_tpot_p50_ms,
                                 min_stream_tok_s=min_stream_tok_s)
    if trace is not None:
        # The trace replayed at each --clients level (tune/trace_replay.py).
        workload = Workload(clients=positive_ints("--clients", clients),
                            trace=read_trace(trace, d.vllm.max_model_len),
                            trace_path=str(trace))
    else:
        workload = Workload(positive_ints("--contexts", contexts),
                            positive_ints("--clients", clients), output_tokens)
        if max(workload.contexts) + output_tokens > d.vllm.max_model_len:
            raise OpsError(f"--contexts {contexts}: {max(workload.contexts)} + "
                           f"{output_tokens} output tokens exceed vllm.max_model_len = "
                           f"{d.vllm.max_model_len}", exit_code=EXIT_USAGE)
    session.check_outputs(stack, out, write)
    if pr:  # the overlay's work tree, before the search rather than after it
        from tpuserve.tune.pr import repo_root

        repo_root(write or out / f"tune-{stack}-overlay.toml", "--write" if write else "--out")
    path = state or session.state_path(stack)
    with session.locked(path):
        prep = session.prepare(d, raw, workload, limits, repetitions, path, fresh=fresh)
        node = node_for(d, raw, workload, api_key)
        if prep.state.node_on == TERRAFORM and hasattr(node, "check_deployed"):
            node.check_deployed()  # the end restores Terraform's script: it must be the node's
        usd_h, price_source = session.price(d)
        bench = cost.bench_time(workload, _throughput(d))
        est = cost.estimate(prep.space.candidates, bench, repetitions, usd_h)
        common.log(
            f"tune {stack}: {len(prep.candidates)} candidates ({len(prep.space.refused)} refused), "
            f"{workload.describe()}; constraints: {limits.words()}")
        common.log(
            cost.words(est, usd_h, price_source)
            + (f"; resuming: {prep.state.spent_s / 3600:.2f} h spent" if prep.resumed else ""))
        if not yes:
            _confirm_or_exit()
        tuner = Tuner(node, prep.candidates, prep.state,
                      save=lambda s: session.state_file.save(s, path), usd_per_hour=usd_h,
                      limits=limits, workload=workload, base_reps=repetitions,
                      budget=Budget(budget_usd, budget_hours, first_rep_s=bench.per_rep_s),
                      keep_best=keep_best,
                      log=common.log)
        outcome = tuner.run()
        summary = Summary(stack, usd_h, price_source, limits, workload.describe(), outcome.status,
                          outcome.best, outcome.node_on, est, image=d.vllm.image,
                          accelerator=d.tpu.accelerator_type)
        written = session.write_outputs(summary, prep, out, write)
        from tpuserve.tune.drift import mark

        # Which config the node was left on, for status and review (tune/drift.py).
        mark(prep.state, d, raw, prep.candidates,
             written.get("overlay") if outcome.node_on == outcome.best else None)
        session.state_file.save(prep.state, path)
        # Recorded when the search is over: a run that can resume (interrupted, the node gone, the
        # budget) keeps its candidates, which a learned refusal would change under it.
        if record and outcome.status in (DONE, FAILED):
            from tpuserve.tune.record import record as record_run

            recorded = record_run(d, prep.state, prep.candidates, prep.space.baseline,
                                  outcome.best, workload, log=common.log)
            if recorded is not None:
                written["profile"] = str(recorded)
        common.log(f"{outcome.message}; the node is on: {outcome.node_on}")
        if pr and outcome.status == DONE and "overlay" in written:
            from tpuserve.tune.pr import open_pr

            stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
            open_pr([Path(written["overlay"])], Path(written["report"]), f"tune-{stack}-{stamp}",
                    f"tune {stack}: {outcome.best}", common.log)
        doc = {"ok": outcome.status == DONE, "status": outcome.status, "best": outcome.best,
               "node_on": outcome.node_on, "state": str(path), **written}
        if json_output:
            emit_json(doc)
        else:
            for key in ("overlay", "report", "chart", "profile"):
                if key in written:
                    console.print(f"{key}: {written[key]}")
        code = {DONE: 0, BUDGET: EXIT_BUDGET, INTERRUPTED: EXIT_INTERRUPTED}.get(outcome.status,
                                                                                 EXIT_FAILED)
        if code:
            raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
