"""`tpuserve status [STACK] [--watch [--recover]]`."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tpuserve.ops import recovery
from tpuserve.ops.server import http_client
from tpuserve.ops.stack_status import (
    HEALTH_TIMEOUT_S,
    StackStatus,
    format_duration,
    stack_status,
)

from . import common
from .common import JsonOpt, command, console, emit_json, log


def _facts(s: StackStatus) -> list[tuple[str, str]]:
    n = s.node
    at, rule = s.ends_at
    state = "node: none"
    if n:
        state = f"node {n.state}" + (f" ({n.health.lower()})" if n.health != "HEALTH_UNSPECIFIED"
                                     else "")
    if s.is_flex:
        state = f"queued resource {s.qr_state}, {state}"
    health = s.health_detail if s.health_ok is None else (
        f"{'ok' if s.health_ok else 'failing'} ({s.health_detail})")
    rows = [
        ("state", state),
        ("health", health),
        ("endpoint", f"{s.endpoint}/v1" if s.endpoint else "-"),
        ("boot", s.boot.state + (f": {s.boot.reason}" if s.boot.reason else "")),
    ]
    if n and s.served is not None:
        rows.append(("config", s.served.describe()))
        reconverge = s.served.describe_reconverge()
        if reconverge:
            rows.append(("reconverge", reconverge))
    if s.running_s is not None:
        rows.append(("running", f"{format_duration(s.running_s)} since "
                     f"{n.create_time:%Y-%m-%d %H:%M} UTC" if n and n.create_time else "-"))
        rows.append(("spent", f"${s.spent_usd:,.2f} at ${s.d.usd_per_hour:.4f}/h"))
    if s.billing:
        ends = f"{format_duration(s.ends_in_s)} ({rule})" if at else rule
        rows.append(("ends in", ends))
    return rows


def render(statuses: list[StackStatus]) -> None:
    for s in statuses:
        title = f"[bold]{s.d.name}[/] ({s.d.stack.provisioning_model}, {s.d.gcp.zone})"
        if not s.deployed:
            console.print(f"{title}: not deployed")
            continue
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(overflow="fold")
        for key, value in _facts(s):
            grid.add_row(key, value)
        console.print(title)
        console.print(grid)
        if s.boot.phases:
            phases = Table("boot phase", "at (UTC)", "detail", show_edge=False)
            for p in s.boot.phases:
                phases.add_row(p.label, p.at.strftime("%m-%d %H:%M:%S") if p.at else "-",
                               p.detail)
            console.print(phases)
        for problem in s.problems:
            console.print(f"[bold red]problem:[/] {problem}", soft_wrap=True)
        console.print()


def gather(stack: str | None) -> list[StackStatus]:
    found = common.deployments()
    names = [common.load_stack(stack).name] if stack else list(found)
    tpu = common.tpu_api()
    with http_client(HEALTH_TIMEOUT_S) as http:
        return [stack_status(found[n], tpu=tpu, http=http) for n in names]


@command
def status(
    stack: Annotated[str | None, typer.Argument(help="One stack; all configured stacks when "
                                                "omitted.", show_default=False)] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes (--watch).",
                                            min=0)] = 60.0,
    iterations: Annotated[int, typer.Option(help="Stop after this many refreshes (--watch; "
                                            "0: until Ctrl-C).", min=0)] = 0,
    recover: Annotated[bool, typer.Option(
        "--recover", help="With --watch: replace a PREEMPTED spot node or a SUSPENDED/FAILED "
        "flex queued resource as soon as it is seen (off by default: a flex run that reached "
        "its max run duration is SUSPENDED by design, and replacing it restarts billing).",
    )] = False,
    retries: Annotated[int, typer.Option(help="Recovery attempts per incident.", min=1)] = (
        recovery.DEFAULT_RETRIES
    ),
    json_output: JsonOpt = False,
) -> None:
    """Node (and queued resource) state, health, endpoint, boot phases, time running, money
    spent and time left, for each deployed stack. Also the config the server runs with against
    the deployed one. Exits 1 when a deployed stack has a problem."""
    if recover and not watch:
        raise typer.BadParameter("--recover needs --watch (or use `tpuserve recover STACK`)")
    if not watch:
        statuses = gather(stack)
        if json_output:
            emit_json({"stacks": [s.to_json() for s in statuses]})
        else:
            render(statuses)
        if any(s.problems for s in statuses):
            raise typer.Exit(1)
        return
    n = 0
    try:
        while True:
            n += 1
            statuses = gather(stack)
            if json_output:
                emit_json({"iteration": n, "stacks": [s.to_json() for s in statuses]},
                          line=True)
            else:
                if console.is_terminal:
                    console.clear()
                console.print(time.strftime("%Y-%m-%d %H:%M:%S"), f"(every {interval:g} s, "
                              "Ctrl-C to stop)")
                render(statuses)
            if recover:
                for s in statuses:
                    if s.recoverable:
                        log(f"{s.d.name}: {s.problems[0] if s.problems else 'recoverable'}; "
                            "recovering")
                        recovery.recover(s.d, tpu=common.tpu_api(),
                                         deploy=common.deploy_runner(), retries=retries,
                                         log=log)
            if iterations and n >= iterations:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        log("stopped")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
