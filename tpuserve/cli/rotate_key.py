"""`tpuserve rotate-key STACK`: a new API key, and the node's word that it uses it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from tpuserve.ops import key_rotation
from tpuserve.ops.errors import EXIT_USAGE, OpsError

from . import common
from .common import JsonOpt, StackArg, command, console, emit_json, err_console


@command
def rotate_key(
    stack: StackArg,
    key_file: Annotated[Path | None, typer.Option(
        help="Read the new key from this file (else one is generated and printed once).")] = None,
    disable_old: Annotated[bool, typer.Option(
        help="Once the node uses the new key, disable the versions that were enabled before.",
    )] = False,
    timeout: Annotated[float, typer.Option(help="Overall timeout in seconds (exit 3).",
                                           min=0)] = key_rotation.DEFAULT_TIMEOUT_S,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls.", min=0)] = (
        key_rotation.DEFAULT_POLL_S),
    json_output: JsonOpt = False,
) -> None:
    """Add a new version of the stack's API-key secret (Secret Manager) and wait until the
    node's proxy reports it (guest attribute secret, api_key_sha256=<12 hex>): its watcher
    re-reads the secret at most every 300 s and reloads nginx. Exits 1 on a failed call or no
    node, 3 on timeout. The key is never in argv or a log: --key-file, or a generated key
    printed once on stdout."""
    start = time.monotonic()
    d = common.load_stack(stack)
    if d.kind.on_gke:
        raise OpsError(f"{stack}: rotate-key serves the node stacks; the fleet's pods read the "
                       "key through the Secret Manager CSI driver, whose rotation this "
                       "deployment does not enable: roll the pods after a rotation "
                       "(README 'Secrets')", exit_code=EXIT_USAGE)
    if not d.access.api_key_proxy:
        raise OpsError(f"{stack}: access.api_key_proxy = false: the stack has no API key",
                       exit_code=EXIT_USAGE)
    generated = key_file is None
    key = key_rotation.generate_key() if key_file is None else key_rotation.read_key_file(
        key_file)
    prefix = key_rotation.key_prefix(key)

    from tpuserve.gcp import secret_versions
    from tpuserve.gcp.errors import ApiError

    api = secret_versions.secretmanager()
    api.deadline = start + timeout  # no call outlives the command
    project, secret = d.gcp.project, d.api_key_secret_id
    before = secret_versions.enabled_versions(api, project, secret) if disable_old else []
    version = secret_versions.add_version(api, project, secret, key)
    err_console.print(f"{stack}: added {version} (api_key_sha256={prefix})", markup=False,
                      soft_wrap=True)
    if generated and not json_output:
        # Once, now: a timeout below must not lose it (stdout only; never a log line).
        console.print(key.decode(), markup=False, soft_wrap=True, emoji=False)
    disabled: list[str] = []
    try:
        elapsed, reported = key_rotation.wait_for_prefix(
            d, tpu=common.tpu_api(), prefix=prefix, timeout_s=timeout, poll_s=poll_interval,
            started=start)
        for name in before:
            if name != version:
                secret_versions.disable_version(api, name)
                disabled.append(name)
    except (OpsError, ApiError) as exc:
        if not (generated and json_output):
            raise
        # The new version is the latest already: the node takes it at its next refresh. With
        # --json the key shows nowhere else, so the error document carries it (its one showing).
        line, code = (exc.line, exc.exit_code) if isinstance(exc, OpsError) else (str(exc), 1)
        err_console.print(f"tpuserve: error: {line}", markup=False, emoji=False, soft_wrap=True)
        emit_json({"stack": stack, "ok": False, "error": line, "exit_code": code,
                   "version": version, "key_sha256_prefix": prefix, "disabled": disabled,
                   "key": key.decode()})
        raise typer.Exit(code) from None
    result = key_rotation.RotationResult(stack, version, prefix, elapsed, reported, disabled,
                                         key.decode() if generated else None)
    if json_output:
        emit_json(result.to_json())
        return
    err_console.print(f"{stack}: the node uses the new key after {elapsed:.0f} s ({reported})"
                      + (f"; disabled {', '.join(disabled)}" if disabled else ""),
                      markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("rotate-key")(rotate_key)
