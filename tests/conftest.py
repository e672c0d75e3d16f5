"""Session fixtures: the default config and ONE synthesis of every stack per test session."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

# The CLI tests' fixtures (fake TPU API, fake OpenAI server, a config pointing at them).
from tests.cli_support import cli_env, fake_oai, fake_tpu  # noqa: F401
from tpuserve.config import Deployment, load_deployments


@pytest.fixture(scope="session")
def deployments() -> dict[str, Deployment]:
    return load_deployments(environ={})


# Secret-looking values placed in the environment during synth: none may reach the output.
CANARIES = {"HF_TOKEN": "hf_canaryTOKENvalue0123456789", "OPENAI_API_KEY": "sk-canary-apikey-42"}


def synth(deployments: dict[str, Deployment], outdir: Path) -> dict[str, dict[str, Any]]:
    """Synthesize the given stacks into outdir; return {stack: cdk.tf.json as a dict}."""
    import main

    with pytest.MonkeyPatch.context() as mp:
        for name, value in CANARIES.items():
            mp.setenv(name, value)
        main.build_app(deployments, outdir=str(outdir)).synth()
    return {
        p.name: json.loads((p / "cdk.tf.json").read_text())
        for p in sorted((outdir / "stacks").iterdir())
    }


def xdist_worker() -> str | None:
    """This process's pytest-xdist worker id (gw0, gw1, ...), None when not under xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory, deployments: dict[str, Deployment]) -> Path:
    """The synthesized default stacks: once per run, shared by the xdist workers (the first
    to take the lock synthesizes into the run's shared temp root, the others read it; the
    directory is keyed by a hash of the deployments it was synthesized from). Read-only."""
    if xdist_worker() is None:
        outdir = tmp_path_factory.mktemp("cdktf.out")
        synth(deployments, outdir)
        return outdir
    root = tmp_path_factory.getbasetemp().parent  # one per run, shared by its workers
    key = hashlib.sha256(repr(sorted(deployments.items())).encode()).hexdigest()[:16]
    outdir = root / f"cdktf.out-{key}"
    with (root / f"cdktf.out-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not outdir.is_dir():
            partial = root / f"cdktf.out-{key}.partial-{xdist_worker()}"
            shutil.rmtree(partial, ignore_errors=True)
            synth(deployments, partial)
            partial.rename(outdir)
    return outdir


@pytest.fixture(scope="session")
def synthesized(synth_dir: Path) -> dict[str, dict[str, Any]]:
    """{stack name: the synthesized cdk.tf.json as a dict}."""
    return {
        p.name: json.loads((p / "cdk.tf.json").read_text())
        for p in sorted((synth_dir / "stacks").iterdir())
    }


# The ordinary provider import costs ~10 s of one core: the synthesis through that path starts
# in a child process as soon as collection ends, and runs on the other core while the suite
# goes on; test_cdk_import waits for it.
FULL_IMPORT_TEST = "test_full_import_synthesizes_identical_json"
_full_synth: dict[str, object] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under xdist every worker collects every test but only one runs it: the fixture starts
    # the child there, and the other worker keeps the second core busy meanwhile.
    if xdist_worker() is None and any(FULL_IMPORT_TEST in item.nodeid
                                      for item in session.items):
        _start_full_import_synth()


def _start_full_import_synth() -> None:
    outdir = Path(tempfile.mkdtemp(prefix="tpuserve-full-import-"))
    root = Path(__file__).resolve().parent.parent
    _full_synth["outdir"] = outdir
    _full_synth["proc"] = subprocess.Popen(
        [sys.executable, str(root / "bench" / "synth"), "--once", "full", str(outdir)],
        env={**os.environ, "TPUSERVE_CDK_IMPORT": "full"}, cwd=root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = _full_synth.get("proc")
    if isinstance(proc, subprocess.Popen) and proc.poll() is None:
        proc.kill()
        proc.wait()
    if "outdir" in _full_synth:
        shutil.rmtree(str(_full_synth["outdir"]), ignore_errors=True)


@pytest.fixture
def full_import_synth() -> tuple[dict[str, object], Path]:
    """(the figures the child printed, its output directory), once the child is done."""
    if "proc" not in _full_synth:
        _start_full_import_synth()
    proc = _full_synth["proc"]
    assert isinstance(proc, subprocess.Popen)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    outdir = _full_synth["outdir"]
    assert isinstance(outdir, Path)
    return json.loads(out.strip().splitlines()[-1]), outdir
