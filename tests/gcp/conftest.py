"""Fixtures of the tests/gcp TPU tests: a fake TPU API, a fake clock, a client on both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.tpu_api import ZERO_DURATIONS, FakeTpuApi
from tests.gcp.tpu_support import Clock
from tpuserve.gcp.tpu.client import TpuClient


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as server:
        yield server


@pytest.fixture
def fast_api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi(durations=ZERO_DURATIONS) as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(api: FakeTpuApi, clock: Clock) -> TpuClient:
    return TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
