"""`tpuserve endpoint STACK`: the base URL, the node's TLS certificate and how to give it to
clients, and how to get the API key (never the key itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tpuserve.ops import tls
from tpuserve.ops.boot_phases import NAMESPACE
from tpuserve.ops.errors import EXIT_USAGE, OpsError
from tpuserve.settings import Deployment

from . import common
from .common import API_KEY_ENV, JsonOpt, StackArg, command, console, emit_json


def create_key_command(d: Deployment) -> str:
    """A strong key (256 random bits) straight into a new secret version: no file, no argv."""
    return (
        "python3 -c 'import secrets; print(secrets.token_urlsafe(32), end=\"\")' | "
        f"gcloud secrets versions add {d.api_key_secret_id} --project={d.gcp.project} "
        "--data-file=-"
    )


def client_howto(base: str, cert_file: str) -> dict[str, str]:
    """How curl and the OpenAI SDK trust the node's certificate (it names the node's external
    IP, so standard verification with it as the only CA works)."""
    return {
        "curl": f'curl --cacert {cert_file} -H "Authorization: Bearer ${API_KEY_ENV}" '
                f"{base}/v1/models",
        "openai_sdk": (
            "import os, ssl, httpx, openai; client = openai.OpenAI(base_url="
            f'"{base}/v1", api_key=os.environ["{API_KEY_ENV}"], http_client=httpx.Client('
            f'verify=ssl.create_default_context(cafile="{cert_file}")))'
        ),
        "tpuserve": f"tpuserve smoke --endpoint {base} --cacert {cert_file}",
    }


@command
def endpoint(
    stack: StackArg,
    cert_out: Annotated[Path | None, typer.Option(
        "--cert-out", help="Write the node's TLS certificate (PEM, public) to this file for "
        "curl --cacert and the OpenAI SDK.", show_default=False)] = None,
    json_output: JsonOpt = False,
) -> None:
    """The server's base URL (the external IP changes with every new node: never hard-code it),
    its TLS certificate (made on the node at boot; SHA-256 published in guest attributes) with
    how to give it to curl and the OpenAI SDK, and the command that prints its API key. The
    fleet: its Gateway's address (http://ADDRESS/v1), or https://DOMAIN/v1 with fleet.domain
    (a Google-managed certificate: nothing to pin)."""
    d = common.load_stack(stack)
    if d.kind.on_gke:
        _endpoint_fleet(d, cert_out, json_output)
        return
    tpu = common.tpu_api()
    node = tpu.get_node(d)
    if node is None:
        raise OpsError(f"{stack}: node {d.node_name} does not exist in {d.gcp.project}/"
                       f"{d.gcp.zone}", hint=f"deploy it: npx cdktf deploy {stack}")
    if not node.external_ip:
        raise OpsError(f"{stack}: node {d.node_name} is {node.state} with no external IP yet",
                       hint=f"`tpuserve wait {stack}` blocks until it serves")
    pending = ""
    try:
        target = tls.stack_target(d, node.external_ip,
                                  tpu.guest_attributes(d, NAMESPACE))
        base, pin = target.base_url, target.pin
    except OpsError as exc:
        if cert_out is not None:
            raise
        # Still booting: the URL is known, the certificate comes with the boot's secrets step.
        base, pin, pending = f"https://{node.external_ip}:{d.vllm.port}", None, exc.message
    cert_file = str(cert_out) if cert_out else f"tpuserve-{stack}.pem"
    if cert_out is not None:
        if pin is None:
            raise OpsError(f"--cert-out: {stack} serves plain HTTP (access.tls = 'off'): no "
                           "certificate", exit_code=EXIT_USAGE)
        cert_out.write_text(pin.pem)
    howto = client_howto(base, cert_file) if pin else {}
    key_cmd = common.key_command(d) if d.access.api_key_proxy else None
    if json_output:
        emit_json({
            "stack": stack,
            "node_state": node.state,
            "base_url": base,
            "openai_base_url": base + "/v1",
            "tls": {"sha256": pin.fingerprint, "cert_pem": pin.pem,
                    "cert_file": str(cert_out) if cert_out else None, **howto} if pin else None,
            "tls_pending": pending or None,
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
    if pending:
        console.print(f"TLS          {pending}", soft_wrap=True, markup=False)
    elif pin is None:
        console.print("TLS          off: access.tls = 'off', the key and prompts travel in clear "
                      "text")
    else:
        console.print(f"TLS sha256   {tls.colons(pin.fingerprint)} (self-signed, made on the "
                      "node; a new node makes a new one)", soft_wrap=True, emoji=False)
        if cert_out is None:
            console.print(f"certificate  tpuserve endpoint {stack} --cert-out {cert_file}",
                          soft_wrap=True, markup=False)
        else:
            console.print(f"certificate  written to {cert_file} (public)", soft_wrap=True,
                          markup=False)
        console.print(f"curl         {howto['curl']}", soft_wrap=True, markup=False)
        console.print(f"OpenAI SDK   {howto['openai_sdk']}", soft_wrap=True, markup=False)
    if key_cmd:
        console.print(f'API key      export {API_KEY_ENV}="$({key_cmd})"', soft_wrap=True,
                      markup=False)
        console.print(f"no key yet?  {create_key_command(d)}", soft_wrap=True, markup=False)
    else:
        console.print("API key      none: access.api_key_proxy = false (the server is open to "
                      "access.api_source_ranges)")


def _endpoint_fleet(d: Deployment, cert_out: Path | None, json_output: bool) -> None:
    from tpuserve.gcp import kube
    from tpuserve.ops import fleet_status
    from tpuserve.render.fleet_bundle import GATEWAY
    from tpuserve.render.fleet_bundle import NAMESPACE as K8S_NAMESPACE

    if cert_out is not None:
        raise OpsError(f"--cert-out: {d.name} has no certificate to pin (plain HTTP, or a "
                       "Google-managed certificate the system's CAs verify)",
                       exit_code=EXIT_USAGE)
    k = kube.connect(d)
    gw = k.gateway(K8S_NAMESPACE, GATEWAY)
    if gw is None:
        raise OpsError(f"{d.name}: no Gateway {K8S_NAMESPACE}/{GATEWAY} in cluster "
                       f"{kube.cluster_name(d)}", hint=f"deploy it: npx cdktf deploy {d.name}")
    base = fleet_status.endpoint_url(d, gw)
    address = fleet_status.gateway_address(gw)
    if base is None:
        raise OpsError(f"{d.name}: the Gateway {K8S_NAMESPACE}/{GATEWAY} has no address yet",
                       hint=f"`tpuserve wait {d.name}` blocks until it serves")
    key_cmd = common.key_command(d) if d.access.api_key_proxy else None
    domain = d.fleet.domain
    curl = (f'curl -H "Authorization: Bearer ${API_KEY_ENV}" {base}/v1/models' if key_cmd
            else f"curl {base}/v1/models")
    if json_output:
        emit_json({
            "stack": d.name,
            "cluster": kube.cluster_name(d),
            "kube_context": kube.context_name(d),
            "gateway_address": address,
            "gateway_programmed": fleet_status.programmed(gw),
            "base_url": base,
            "openai_base_url": base + "/v1",
            "tls": {"domain": domain, "verify": "system CAs (Google-managed certificate)"}
            if domain else None,
            "curl": curl,
            "api_key_required": d.access.api_key_proxy,
            "api_key_secret": d.api_key_secret_id if key_cmd else None,
            "api_key_command": key_cmd,
            "create_api_key_command": create_key_command(d) if key_cmd else None,
        })
        return
    console.print(f"base URL     {base}")
    console.print(f"OpenAI base  {base}/v1")
    console.print(f"gateway      {address or 'no address yet'}"
                  + (f" (point {domain} at it)" if domain and address else ""), markup=False)
    if domain:
        console.print(f"TLS          Google-managed certificate for {domain}: the system's CAs "
                      "verify it (nothing to pin)", soft_wrap=True, markup=False)
    else:
        console.print("TLS          off: plain HTTP on the Gateway, the key and prompts travel "
                      "in clear text (set fleet.domain for HTTPS)", soft_wrap=True,
                      markup=False)
    console.print(f"curl         {curl}", soft_wrap=True, markup=False)
    if key_cmd:
        console.print(f'API key      export {API_KEY_ENV}="$({key_cmd})"', soft_wrap=True,
                      markup=False)
        console.print(f"no key yet?  {create_key_command(d)}", soft_wrap=True, markup=False)
    else:
        console.print("API key      none: access.api_key_proxy = false")


def register(app: typer.Typer) -> None:
    app.command("endpoint")(endpoint)
