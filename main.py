"""cdktf app: one self-contained stack per provisioning model (spot, ondemand, flex).

`cdktf synth|deploy|destroy` runs this through cdktf.json. Configuration errors for every
stack are printed together and stop synth before any file is written; warnings are printed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tpuserve.settings import ConfigError, Deployment, load

if TYPE_CHECKING:
    from stacks.cdk import App as CdkApp


def build_app(deployments: Mapping[str, Deployment], outdir: str | None = None) -> CdkApp:
    """Wire the stacks into an App (synthesis is the caller's choice).

    The cdktf imports happen here, not at module import, so a config error is reported
    before the seconds-long jsii start-up.
    """
    from stacks.cdk import App
    from stacks.flex import FlexStack
    from stacks.tpu_vm import TpuVmStack

    app = App(outdir=outdir) if outdir else App()
    for d in deployments.values():
        if d.stack.provisioning_model == "flex":
            FlexStack(app, d)
        else:
            TpuVmStack(app, d)
    return app


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
    build_app(loaded.deployments, outdir=outdir).synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
