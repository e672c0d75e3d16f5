"""`tpuserve endpoint STACK`: the base URL, and how to get the API key (never the key itself)."""

from __future__ import annotations

import typer

from tpuserve.config import Deployment
from tpuserve.ops.errors import OpsError

from . import common
from .common import API_KEY_ENV, JsonOpt, StackArg, command, console, emit_json


def create_key_command(d: Deployment) -> str:
    """A strong key (256 random bits) straight into a new secret version: no file, no argv."""
    return (
        "python3 -c 'import secrets; print(secrets.token_urlsafe(32), end=\"\")' | "
        f"gcloud secrets versions add {d.api_key_secret_id} --project={d.gcp.project} "
        "--data-file=-"
    )


@command
def endpoint(stack: StackArg, json_output: JsonOpt = False) -> None:
    """The server's base URL (the external IP changes with every new node: never hard-code it)
    and the command that prints its API key."""
    d = common.load_stack(stack)
    node = common.node_api().get(d)
    if node is None:
        raise OpsError(f"{stack}: node {d.node_name} does not exist in {d.gcp.project}/"
                       f"{d.gcp.zone}", hint=f"deploy it: npx cdktf deploy {stack}")
    if not node.external_ip:
        raise OpsError(f"{stack}: node {d.node_name} is {node.state} with no external IP yet",
                       hint=f"`tpuserve wait {stack}` blocks until it serves")
    base = f"http://{node.external_ip}:{d.vllm.port}"
    key_cmd = common.key_command(d) if d.access.api_key_proxy else None
    if json_output:
        emit_json({
            "stack": stack,
            "node_state": node.state,
            "base_url": base,
            "openai_base_url": base + "/v1",
            "api_key_required": d.access.api_key_proxy,
            "api_key_secret": d.api_key_secret_id if d.access.api_key_proxy else None,
            "api_key_command": key_cmd,
            "create_api_key_command": create_key_command(d) if key_cmd else None,
        })
        return
    console.print(f"base URL     {base}")
    console.print(f"OpenAI base  {base}/v1")
    if node.state != "READY":
        console.print(f"[yellow]node is {node.state}: `tpuserve wait {stack}`[/]")
    if key_cmd:
        console.print(f'API key      export {API_KEY_ENV}="$({key_cmd})"', soft_wrap=True,
                      markup=False)
        console.print(f"no key yet?  {create_key_command(d)}", soft_wrap=True, markup=False)
    else:
        console.print("API key      none: access.api_key_proxy = false (the server is open to "
                      "access.api_source_ranges)")


def register(app: typer.Typer) -> None:
    app.command("endpoint")(endpoint)
