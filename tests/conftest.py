"""Session fixtures: the default config and ONE synthesis of every stack per test session."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory, deployments: dict[str, Deployment]) -> Path:
    outdir = tmp_path_factory.mktemp("cdktf.out")
    synth(deployments, outdir)
    return outdir


@pytest.fixture(scope="session")
def synthesized(synth_dir: Path) -> dict[str, dict[str, Any]]:
    """{stack name: the synthesized cdk.tf.json as a dict}."""
    return {
        p.name: json.loads((p / "cdk.tf.json").read_text())
        for p in sorted((synth_dir / "stacks").iterdir())
    }
