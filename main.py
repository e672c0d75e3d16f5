"""cdktf app: the deployment's long-lived `base`, and one disposable serving stack per
provisioning model (spot, ondemand, flex, and the GKE fleet) that stands on it by name.

`cdktf synth|deploy|destroy` runs this through cdktf.json. Configuration errors for every
stack are printed together and stop synth before any file is written; warnings are printed.
TPUSERVE_TEARDOWN=<deployment> synthesizes the base without its deletion protection, for
`cdktf destroy base` on purpose (stacks/base.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tpuserve.contracts import TEARDOWN_ENV
from tpuserve.kinds import Kind
from tpuserve.settings import ConfigError, Deployment, load
from tpuserve.settings.base_stack import Base

if TYPE_CHECKING:
    from stacks.cdk import App as CdkApp


def build_app(deployments: Mapping[str, Deployment], outdir: str | None = None, *,
              base: Base | None = None, teardown: bool = False) -> CdkApp:
    """Wire the stacks into an App (synthesis is the caller's choice): the base (by default
    the one the deployments stand on) and every serving stack.

    The cdktf imports happen here, not at module import, so a config error is reported
    before the seconds-long jsii start-up.
    """
    from stacks.base import BaseStack
    from stacks.cdk import App

    app = App(outdir=outdir) if outdir else App()
    if base is None and deployments:
        base = next(iter(deployments.values())).base
    if base is not None:
        BaseStack(app, base, teardown=teardown)
    for d in deployments.values():
        stack_class(d.kind)(app, d)
    return app


def stack_class(kind: Kind) -> Callable[[CdkApp, Deployment], object]:
    """The stack class the kind names ("module:Class" under stacks/, tpuserve/kinds)."""
    module, _, name = kind.stack_class.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> int:
    try:
        loaded = load()
    except ConfigError as exc:
        print(f"tpuserve: {exc}", file=sys.stderr)
        return 1
    for warning in loaded.warnings:
        print(f"tpuserve: warning: {warning}", file=sys.stderr)
    # Absolute: jsii's node process keeps the cwd it started with. The cdktf CLI names the
    # directory in CDKTF_OUTDIR.
    outdir = os.environ.get("CDKTF_OUTDIR") or os.path.abspath("cdktf.out")
    teardown = loaded.base is not None and os.environ.get(TEARDOWN_ENV) == loaded.base.deployment
    if teardown:
        print(f"tpuserve: {TEARDOWN_ENV}={loaded.base.deployment}: the base is synthesized "
              "without deletion protection (`cdktf destroy base` deletes its buckets and "
              "secrets)", file=sys.stderr)
    build_app(loaded.deployments, outdir=outdir, base=loaded.base, teardown=teardown).synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
