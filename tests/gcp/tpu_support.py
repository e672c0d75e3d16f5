"""Shared names of the tests/gcp TPU tests (no tests here): the queued resource under test,
its body, a fake clock, a progress recorder, and the provisioner run as Terraform runs it.
The fixtures are in tests/gcp/conftest.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tests.fakes.tpu_api import flex_body
from tpuserve.gcp.tpu.queued_resources import QueuedResourceRef
from tpuserve.paths import REPO_ROOT
from tpuserve.settings import Deployment, from_raw, load_raw

PROJECT, ZONE, QR_ID = "proj-test-1", "us-west4-a", "tpuserve-flex"
REF = QueuedResourceRef(PROJECT, ZONE, QR_ID)


class Clock:
    """A fake monotonic clock; `sleep` advances it and runs the hooks (e.g. api.advance)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.hooks: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        for hook in self.hooks:
            hook()


class Seen:
    """A Progress callback that records states."""

    def __init__(self) -> None:
        self.states: list[str] = []

    def __call__(self, state: str, elapsed: float) -> None:
        if not self.states or self.states[-1] != state:
            self.states.append(state)


def body(**kw: Any) -> dict[str, Any]:
    return flex_body(PROJECT, ZONE, QR_ID, **kw)


def flex_here() -> Deployment:
    """The flex deployment whose node is REF's (same project, zone and id)."""
    return from_raw(load_raw(environ={"TPUSERVE_PROJECT": PROJECT,
                                               "TPUSERVE_ZONE": ZONE})).deployments["flex"]


def run_module(env: dict[str, str], *argv: str, stdin: str = "",
               ) -> subprocess.CompletedProcess[str]:
    """`python -m tpuserve.queued_resource ...`, as the flex stack's provisioners run it."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("CLOUDSDK_", "GCE_METADATA", "GOOGLE_"))}
    return subprocess.run(
        [sys.executable, "-m", "tpuserve.queued_resource", *argv], input=stdin, cwd=REPO_ROOT,
        env={**base, "TPUSERVE_TIME_SCALE": "0.001", "TPUSERVE_QR_POLL_SECONDS": "0", **env},
        capture_output=True, text=True, timeout=120, check=False,
    )


def one_line(stderr: str) -> str:
    progress = re.compile(r"tpuserve: queued resource [a-z0-9-]+: ")  # one line per state
    lines = [ln for ln in stderr.splitlines()
             if ln.startswith("tpuserve: ") and not progress.match(ln)]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "<" not in lines[0], stderr
    return lines[0]
