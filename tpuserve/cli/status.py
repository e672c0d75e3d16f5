"""`tpuserve status [STACK] [--watch [--recover]]`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from tpuserve.ops import recovery
from tpuserve.ops.server import http_client
from tpuserve.ops.stack_status import HEALTH_TIMEOUT_S
from tpuserve.ops.status_model import StatusModel
from tpuserve.ops.status_read import Status, reads_tpu, status_for

from . import common
from .common import JsonOpt, command, console, emit_json, log


def render_model(m: StatusModel, drift: str | None = None) -> None:
    """One stack's lines in the table, whatever its kind; DRIFT: the node off Terraform's
    script, said after the facts."""
    t = m.table
    if t.summary is not None:
        console.print(f"{t.title}: {t.summary}", soft_wrap=True if t.wrap_summary else None)
        if t.gap_after_summary:
            console.print()
        return
    console.print(t.title)
    if t.rows:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(overflow="fold")
        for key, value in [*t.rows, ("dashboard", m.facts.dashboard_url)]:
            grid.add_row(key, value)
        console.print(grid)
    for sub in t.tables:
        if sub.rows:
            table = Table(*sub.headers, show_edge=False)
            for row in sub.rows:
                table.add_row(*row)
            console.print(table)
    if drift is not None:
        console.print(f"[bold yellow]drift:[/] {drift}", soft_wrap=True, markup=True,
                      highlight=False)
    for problem in m.facts.problems:
        console.print(f"[bold red]problem:[/] {problem}", soft_wrap=True)
    console.print()


def render(statuses: list[Status]) -> None:
    for s in statuses:
        d = _drift(s)
        render_model(s.model(), None if d is None else d.line())


def _drift(s: Status) -> Any:
    """A VM stack's node left off Terraform's script by `tpuserve tune` (tune/drift.py)."""
    if s.d.kind.on_gke or not s.model().facts.deployed:
        return None
    from tpuserve.tune.drift import drift_for
    from tpuserve.tune.session import state_path

    config = s.to_json().get("config")
    running = config.get("running") if isinstance(config, dict) else None
    return drift_for(s.d, state_path(s.d.name), running)


def _json(s: Status) -> dict[str, Any]:
    """A stack's JSON, with `tune_drift` when tune left its node off Terraform's script."""
    doc = s.to_json()
    d = _drift(s)
    return doc if d is None else {**doc, "tune_drift": d.to_json()}


def gather(stack: str | None) -> list[Status]:
    found = common.deployments()
    names = [common.load_stack(stack).name] if stack else list(found)
    # The fleet is read from its cluster (a stack named on the command line: its errors are
    # the command's; among every stack: that stack's problem).
    tpu = common.tpu_api() if any(reads_tpu(found[n]) for n in names) else None
    with http_client(HEALTH_TIMEOUT_S) as http:
        return [status_for(found[n], tpu=tpu, http=http, strict=stack is not None)
                for n in names]


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
    the deployed one. The fleet: replicas ready/desired, the autoscaler's metric against its
    target, the Gateway's address, each pod's state and why a pending pod waits (capacity,
    quota, compiling), and $/hour at the current replicas. Exits 1 when a deployed stack has a
    problem."""
    if recover and not watch:
        raise typer.BadParameter("--recover needs --watch (or use `tpuserve recover STACK`)")
    if not watch:
        statuses = gather(stack)
        if json_output:
            emit_json({"stacks": [_json(s) for s in statuses]})
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
                emit_json({"iteration": n, "stacks": [_json(s) for s in statuses]},
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
