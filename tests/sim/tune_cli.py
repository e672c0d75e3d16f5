"""`python -m tests.sim.tune_cli ARGS`: the product's CLI (`python -m tpuserve ARGS`), its boot
scripts rendered with the simulated node's own vLLM backend port (SIM_BACKEND_PORT) instead of
the product's fixed one, as the boot tests render theirs (tests/render/boot/support.py). Every
simulated node on a machine would otherwise share 127.0.0.1:8001: a second one running at the
same time (another test, another worker) answered the first one's readiness probe and proxy,
or took its port, so a boot the seed kills read as healthy. Nothing else changes.
"""

from __future__ import annotations

import os

PORT_ENV = "SIM_BACKEND_PORT"

if __name__ == "__main__":
    from tpuserve.cli import main
    from tpuserve.render import boot_script

    defaults = boot_script.render_startup.__kwdefaults__
    assert defaults is not None and "backend_port" in defaults
    defaults["backend_port"] = int(os.environ[PORT_ENV])
    main()
