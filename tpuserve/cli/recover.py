"""`tpuserve recover STACK`: replace a PREEMPTED spot node or a SUSPENDED/FAILED flex queued
resource by deleting it and re-running the stack's deployment (Terraform recreates it)."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuserve.ops import recovery
from tpuserve.ops.errors import EXIT_USAGE, OpsError

from . import common
from .common import JsonOpt, StackArg, command, emit_json, log


@command
def recover(
    stack: StackArg,
    retries: Annotated[int, typer.Option(help="Attempts before giving up.", min=1)] = (
        recovery.DEFAULT_RETRIES
    ),
    json_output: JsonOpt = False,
) -> None:
    """Delete what is dead and re-run `npx cdktf deploy STACK --auto-approve` (override with
    TPUSERVE_DEPLOY_COMMAND, '{stack}' is replaced). A healthy stack is left alone (exit 0).
    Spot and on-demand: the node's billing guard (a Cloud Tasks task) is re-armed. The fleet
    is refused: GKE heals it."""
    from tpuserve.gcp.billing_guard import GuardApi

    d = common.load_stack(stack)
    if d.kind.on_gke:
        # GKE replaces failed nodes and pods itself; a re-deploy would change nothing.
        raise OpsError("the fleet heals itself (GKE replaces failed nodes and pods): "
                       "nothing to recover", hint=f"tpuserve status {stack} says why a "
                       "replica is not ready", exit_code=EXIT_USAGE)
    result = recovery.recover(
        d, tpu=common.tpu_api(), deploy=common.deploy_runner(),
        retries=retries, log=log, guard=GuardApi(),
    )
    if json_output:
        emit_json(result.to_json())


def register(app: typer.Typer) -> None:
    app.command("recover")(recover)
