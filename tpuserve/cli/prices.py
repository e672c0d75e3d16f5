"""`tpuserve prices refresh`: today's TPU prices from the Cloud Billing Catalog, into a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import JsonOpt, command, emit_json, err_console

DEFAULT_TIMEOUT_S = 120.0


def _target(catalog_file: Path | None) -> Path:
    """--catalog-file, else the config's [pricing] catalog_file, else the cache path. Read from
    the raw config: a malformed old file refuses the deployments, and must not block its fix."""
    if catalog_file is not None:
        return catalog_file
    from tpuserve.prices import default_catalog_file
    from tpuserve.settings.base import ConfigError
    from tpuserve.settings.loader import load_raw
    from tpuserve.settings.sections import PricingSettings

    pricing = load_raw().get("pricing", {})
    try:
        named = PricingSettings.model_validate(
            {"catalog_file": pricing.get("catalog_file")} if isinstance(pricing, dict) else {})
    except ValueError as exc:
        raise ConfigError([str(exc).splitlines()[-1].strip()]) from None
    return named.catalog_path or default_catalog_file()


@command
def refresh(
    catalog_file: Annotated[Path | None, typer.Option(
        help="Write here (default: [pricing] catalog_file, else ~/.cache/tpuserve/prices.json).",
    )] = None,
    timeout: Annotated[float, typer.Option(
        help="Seconds for every Catalog call together, retries included.", min=1)] = (
        DEFAULT_TIMEOUT_S),
    json_output: JsonOpt = False,
) -> None:
    """Read TPU v5e and v6e prices per region and provisioning model from the Cloud Billing
    Catalog API (services.skus.list, application-default credentials) and write them, dated,
    to a file synth and plan read for 30 days. A SKU it cannot read is refused (one line: which
    SKU, which field) and nothing is written; SKUs of other products are skipped and counted."""
    path = _target(catalog_file)
    from tpuserve.gcp.billing_catalog import catalog_api
    from tpuserve.gcp.billing_catalog import refresh as run
    from tpuserve.ops.errors import OpsError
    from tpuserve.prices.skus import SkuRefused

    try:
        done = run(catalog_api(), path, deadline_s=timeout)
    except SkuRefused as exc:
        raise OpsError(f"prices refresh: {exc}") from None
    if json_output:
        emit_json(done.as_json())
        return
    err_console.print(
        f"wrote {done.prices} prices ({done.skus} SKUs read; {done.unmatched} of other products "
        f"and {done.commitments} commitments skipped) to {done.path}, read "
        f"{done.read_at:%Y-%m-%d %H:%M}Z", markup=False, emoji=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    def prices() -> None:
        """Cloud TPU prices per region and provisioning model, each with its source: `refresh`
        reads today's from the Cloud Billing Catalog API into the file synth and plan read."""

    app.callback(no_args_is_help=True)(prices)
    app.command("refresh")(refresh)
