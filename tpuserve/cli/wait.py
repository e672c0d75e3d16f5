"""`tpuserve wait STACK`: block until the server answers; print its endpoint."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from tpuserve.ops import waiter
from tpuserve.ops.bounded_http import Deadline
from tpuserve.ops.server import http_client
from tpuserve.ops.stack_status import HEALTH_TIMEOUT_S, format_duration
from tpuserve.ops.tls import colons
from tpuserve.settings import Deployment

from . import common
from .common import JsonOpt, StackArg, command, console, emit_json, err_console


@command
def wait(
    stack: StackArg,
    timeout: Annotated[float, typer.Option(help="Overall timeout in seconds (exit 3).",
                                           min=0)] = waiter.DEFAULT_TIMEOUT_S,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls.", min=0)] = (
        waiter.DEFAULT_POLL_S
    ),
    json_output: JsonOpt = False,
) -> None:
    """Wait for queued resource ACTIVE (flex) -> node READY -> boot phases -> /health, then
    print the endpoint. Exits 1 on FAILED/SUSPENDED, PREEMPTED or a boot failure, 3 on timeout.
    The fleet: until a replica is Ready and the Gateway has an address, then /health through
    the Gateway."""
    d = common.load_stack(stack)
    if d.kind.on_gke:
        _wait_fleet(d, timeout, poll_interval, json_output)
        return
    status = err_console.status(f"{stack}: waiting") if err_console.is_terminal else None

    def on_event(e: waiter.WaitEvent) -> None:
        t = format_duration(e.elapsed_s)
        if e.done:
            err_console.print(f"[green]✓[/] {e.phase}: {e.state} [dim]({t})[/]")
        else:
            err_console.print(f"  {e.phase}: {e.state} [dim]({t})[/]", markup=True)
        if status is not None:
            status.update(f"{stack}: {e.phase}: {e.state}")

    if status is not None:
        status.start()
    try:
        # --timeout bounds every call: each /health request (HEALTH_TIMEOUT_S, connect to
        # last byte) and every TPU API call (the waiter gives the client the same deadline).
        with http_client(HEALTH_TIMEOUT_S, deadline=Deadline(timeout)) as http:
            result = waiter.wait_for_stack(
                d, tpu=common.tpu_api(), http=http,
                timeout_s=timeout, poll_s=poll_interval, on_event=on_event,
            )
    finally:
        if status is not None:
            status.stop()
    if json_output:
        emit_json(result.to_json())
        return
    console.print(f"{stack} is serving after {format_duration(result.elapsed_s)}")
    console.print(f"external IP  {result.external_ip}")
    console.print(f"endpoint     {result.endpoint}/v1")
    if result.tls_sha256:
        console.print(f"TLS sha256   {colons(result.tls_sha256)} (pinned; `tpuserve endpoint "
                      f"{stack}` shows how to give it to clients)", soft_wrap=True,
                      emoji=False)
    if d.access.api_key_proxy:
        console.print(f"API key      {common.key_command(d)}", soft_wrap=True)


def _wait_fleet(d: Deployment, timeout: float, poll_s: float, json_output: bool) -> None:
    from tpuserve.ops import fleet_wait

    def on_event(phase: str, state: str, elapsed: float, done: bool) -> None:
        t = format_duration(elapsed)
        mark = "[green]✓[/]" if done else " "
        err_console.print(f"{mark} {phase}: {escape(state)} [dim]({t})[/]", soft_wrap=True)

    with http_client(HEALTH_TIMEOUT_S, deadline=Deadline(timeout)) as http:
        result = fleet_wait.wait_for_fleet(d, http=http, timeout_s=timeout, poll_s=poll_s,
                                           on_event=on_event)
    if json_output:
        emit_json(result.to_json())
        return
    console.print(f"{d.name} is serving after {format_duration(result.elapsed_s)} "
                  f"({result.ready}/{result.desired} replicas ready)")
    console.print(f"gateway      {result.address}")
    console.print(f"endpoint     {result.endpoint}/v1")
    if d.access.api_key_proxy:
        console.print(f"API key      {common.key_command(d)}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("wait")(wait)
