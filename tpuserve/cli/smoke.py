"""`tpuserve smoke [STACK] [--endpoint URL]`: SPEC's validation checks as a pass/fail table."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from tpuserve.ops import smoke as checks
from tpuserve.ops.bounded_http import Deadline
from tpuserve.ops.server import http_client

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
)

_STYLE = {checks.PASS: "[green]pass[/]", checks.FAIL: "[bold red]FAIL[/]",
          checks.SKIP: "[yellow]skip[/]"}


@command
def smoke(
    stack: OptionalStackArg = None,
    endpoint: EndpointOpt = None,
    api_key: ApiKeyOpt = None,
    fingerprint: FingerprintOpt = None,
    cacert: CacertOpt = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the stack's, else the "
                                              "first of /v1/models).", show_default=False)] = None,
    max_model_len: Annotated[int | None, typer.Option(
        help="For the long-prompt check (default: /v1/models, else the stack's config).",
        min=64, show_default=False)] = None,
    expect_auth: Annotated[bool | None, typer.Option(
        "--expect-auth/--no-expect-auth",
        help="Check that requests without the key are refused on /v1 and /metrics (default: "
        "the stack's access.api_key_proxy; with --endpoint: when a key is given).",
        show_default=False)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per request.", min=1)] = 300.0,
    deadline: Annotated[float, typer.Option(
        help="Seconds for every check together; a server that trickles or never ends an "
        "answer fails here.", min=1)] = checks.SmokeOptions.deadline_s,
    json_output: JsonOpt = False,
) -> None:
    """Health, a chat completion, a get_weather tool call, an image, a prompt near
    max_model_len, and (with the API-key proxy) refusals without the key. Exits 1 on any FAIL."""
    # One deadline for the target's lookup, the client and the checks: they agree on when it
    # passed, and no call of the command outlives it.
    overall = Deadline(deadline)
    d = common.load_stack(stack) if stack and not endpoint else None
    if d is not None and d.kind.on_gke:  # the Gateway's address: plain HTTP or a public CA
        target = common.fleet_target(d, api_key, pinned=bool(fingerprint or cacert),
                                     deadline=overall)
    else:
        target, d = common.resolve_target(stack, endpoint, api_key, fingerprint, cacert,
                                          deadline=overall)
    opts = checks.SmokeOptions(
        model=model or (d.vllm.model if d else None),
        max_model_len=max_model_len or (d.vllm.max_model_len if d else None),
        expect_auth=expect_auth if expect_auth is not None else (
            d.access.api_key_proxy if d else bool(target.api_key)
        ),
        timeout_s=timeout, deadline_s=deadline,
    )

    def on_check(c: checks.Check) -> None:
        common.log(f"{c.result:>4}  {c.name}: {c.detail}")

    with http_client(timeout, verify=target.ssl_context, deadline=overall) as http:
        results = checks.run_smoke(target, opts, http=http, on_check=on_check, deadline=overall)
    failed = [c for c in results if not c.ok]
    if json_output:
        emit_json({"base_url": target.base_url, "ok": not failed,
                   "checks": [c.to_json() for c in results]})
    else:
        table = Table("check", "result", "detail", "s", title=f"smoke test of {target.base_url}")
        for c in results:
            table.add_row(c.name, _STYLE[c.result], c.detail, f"{c.seconds:.2f}")
        console.print(table)
        console.print(f"{len(results) - len(failed)}/{len(results)} passed or skipped")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("smoke")(smoke)
