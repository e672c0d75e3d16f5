"""A fleet Deployment for the bundle tests (the default config does not enable the stack)."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.settings import from_raw, load_raw

DIGEST = "ab" * 32
IMAGE = "vllm/vllm-tpu:nightly@sha256:" + DIGEST


def fleet_raw(**fleet: Any) -> dict[str, Any]:
    raw = load_raw(environ={})
    raw["stacks"]["fleet"] = {"provisioning_model": "fleet", "vllm": {"image": IMAGE}}
    if fleet:
        raw["stacks"]["fleet"]["fleet"] = fleet
    return raw


def fleet_deployment(**fleet: Any):
    return from_raw(fleet_raw(**fleet)).deployments["fleet"]


@pytest.fixture(scope="session")
def fleet():
    return fleet_deployment()


@pytest.fixture(scope="session")
def objects(fleet) -> list[dict[str, Any]]:
    from tpuserve.render.fleet_bundle import render_objects

    return render_objects(fleet)
